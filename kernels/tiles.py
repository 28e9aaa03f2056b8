"""Tile configurations, named CUTLASS-style so that a name encodes the whole configuration.

Grammar: ``m{block_M}n{block_N}k{block_K}_s{num_stages}_t{threads}[_w{row|col|sq}][_z{panel}][_p{promote}][_swapab]``
e.g. ``m128n256k128_s3_t256_wrow_z8``. ``lib`` names a library baseline (no tile), ``emulated``
the CPU emulation of a variant's arithmetic.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

LIBRARY = "lib"
EMULATED = "emulated"
_TILE_RE = re.compile(
    r"^m(?P<block_M>\d+)n(?P<block_N>\d+)k(?P<block_K>\d+)_s(?P<num_stages>\d+)_t(?P<threads>\d+)"
    r"(?:_w(?P<policy>row|col|sq))?(?:_z(?P<swizzle>\d+))?(?:_p(?P<promote>\d+))?(?P<swap_ab>_swapab)?$"
)
_POLICIES = {"row": "FullRow", "col": "FullCol", "sq": "Square", None: "Square"}


@dataclass(frozen=True)
class Tile:
    block_M: int
    block_N: int
    block_K: int
    num_stages: int
    threads: int
    policy: str = "Square"  # name of a T.GemmWarpPolicy member
    swizzle: int = 0  # threadblock rasterization panel; 0 = off
    promote: int = 0  # fp32 promotion of the accumulator every ``promote`` K blocks; 0 = never
    swap_ab: bool = False  # compute Cᵀ = B·Aᵀ: block_M tiles N and block_N tiles M (for small M)

    @property
    def name(self) -> str:
        short = {v: k for k, v in _POLICIES.items() if k}[self.policy]
        s = f"m{self.block_M}n{self.block_N}k{self.block_K}_s{self.num_stages}_t{self.threads}"
        if self.policy != "Square":
            s += f"_w{short}"
        if self.swizzle:
            s += f"_z{self.swizzle}"
        if self.promote:
            s += f"_p{self.promote}"
        if self.swap_ab:
            s += "_swapab"
        return s


def parse_tile(name: str) -> Tile:
    """Parse a tile name; a malformed name raises ValueError that quotes it and the grammar."""
    m = _TILE_RE.match(name)
    if not m:
        raise ValueError(
            f"bad tile name {name!r}: expected m<M>n<N>k<K>_s<stages>_t<threads>[_wrow|_wcol|_wsq][_z<panel>]"
            "[_p<promote every n K blocks>][_swapab], e.g. m128n256k128_s3_t256_wrow_z8"
        )
    d = m.groupdict()
    tile = Tile(
        block_M=int(d["block_M"]),
        block_N=int(d["block_N"]),
        block_K=int(d["block_K"]),
        num_stages=int(d["num_stages"]),
        threads=int(d["threads"]),
        policy=_POLICIES[d["policy"]],
        swizzle=int(d["swizzle"] or 0),
        promote=int(d["promote"] or 0),
        swap_ab=bool(d["swap_ab"]),
    )
    for field in ("block_M", "block_N", "block_K", "num_stages", "threads"):
        if getattr(tile, field) <= 0:
            raise ValueError(f"bad tile name {name!r}: {field} must be positive")
    if tile.threads % 128:
        raise ValueError(f"bad tile name {name!r}: threads must be a multiple of 128 (whole warpgroups)")
    return tile


def parse_shape(name: str) -> tuple[int, int, int]:
    """Parse ``{M}x{N}x{K}``."""
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", name)
    if not m or min(int(g) for g in m.groups()) <= 0:
        raise ValueError(f"bad shape {name!r}: expected MxNxK with positive integers, e.g. 4096x4096x4096")
    return tuple(int(g) for g in m.groups())  # type: ignore[return-value]


# The bounds a shape class may set (inclusive); MN is the number of outputs, M·N.
SHAPE_BOUNDS = ("M_max", "N_max", "K_max", "MN_max")


def shape_class(M: int, N: int, K: int, classes: list[dict]) -> str:
    """The name of the first class (config ``shape_classes``) whose bounds all hold for M x N x K."""
    values = {"M_max": M, "N_max": N, "K_max": K, "MN_max": M * N}
    for c in classes:
        if all(values[b] <= c[b] for b in SHAPE_BOUNDS if b in c):
            return c["name"]
    raise ValueError(f"shape {M}x{N}x{K} is in no shape class; the last class must have no bounds")
