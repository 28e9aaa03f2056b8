"""Tile configurations, named CUTLASS-style so that a name encodes the whole configuration.

Grammar: ``m{block_M}n{block_N}k{block_K}_s{num_stages}_t{threads}[_w{row|col}][_z{panel}][_p{promote}][_split{n}][_swapab]``
e.g. ``m128n256k128_s3_t256_wrow_z8``; one spelling per tile (``Tile.name``: no leading zeros, no ``_z0``,
``_p0``, ``_split1`` or ``_wsq``, the default Square policy), which ``parse_tile`` insists on. ``lib``
names a library baseline (no tile), ``emulated`` the CPU emulation of a variant's arithmetic.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

LIBRARY = "lib"
EMULATED = "emulated"
_TILE_RE = re.compile(
    # [0-9], not \d: int() also reads other scripts' digits
    r"m(?P<block_M>[0-9]+)n(?P<block_N>[0-9]+)k(?P<block_K>[0-9]+)_s(?P<num_stages>[0-9]+)_t(?P<threads>[0-9]+)"
    r"(?:_w(?P<policy>row|col|sq))?(?:_z(?P<swizzle>[0-9]+))?(?:_p(?P<promote>[0-9]+))?"
    r"(?:_split(?P<split_k>[0-9]+))?(?P<swap_ab>_swapab)?"
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
    split_k: int = 1  # K split over this many CTAs, whose partial sums are reduced in the kernel

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
        if self.split_k > 1:
            s += f"_split{self.split_k}"
        if self.swap_ab:
            s += "_swapab"
        return s


_GRAMMAR = ("m<M>n<N>k<K>_s<stages>_t<threads>[_wrow|_wcol][_z<panel>][_p<promote every n K blocks>][_split<K split>][_swapab], "
            "in this order, e.g. m128n256k128_s3_t256_wrow_z8")
_CORE_RE = re.compile(r"m[0-9]+n[0-9]+k[0-9]+_s[0-9]+_t[0-9]+")


def parse_tile(name: str) -> Tile:
    """Parse a tile name in its canonical spelling (``Tile.name``); anything else raises ValueError that
    quotes it, the grammar and, where the name parses, the canonical spelling. One spelling per tile:
    the compile records, the run's lookup of them and the result tables all key on ``Tile.name``."""
    m = _TILE_RE.fullmatch(name) if isinstance(name, str) else None
    if not m:
        core = _CORE_RE.match(name) if isinstance(name, str) else None
        rest = f"; unknown or misplaced suffix {name[core.end():]!r}" if core else ""
        raise ValueError(f"bad tile name {name!r}{rest}: expected {_GRAMMAR}")
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
        split_k=int(d["split_k"] or 1),
    )
    for field in ("block_M", "block_N", "block_K", "num_stages", "threads", "split_k"):
        if getattr(tile, field) <= 0:
            raise ValueError(f"bad tile name {name!r}: {field} must be positive")
    if tile.threads % 128:
        raise ValueError(f"bad tile name {name!r}: threads must be a multiple of 128 (whole warpgroups)")
    if tile.threads > MAX_THREADS_PER_BLOCK:
        raise ValueError(f"bad tile name {name!r}: threads must be at most {MAX_THREADS_PER_BLOCK} (a CUDA block's limit)")
    # leading zeros, _z0, _p0, _split1 and _wsq (the default policy) parse to a tile whose name is spelled otherwise
    if tile.name != name:
        raise ValueError(f"bad tile name {name!r}: not the canonical spelling; write {tile.name!r}")
    return tile


def parse_shape(name: str) -> tuple[int, int, int]:
    """Parse ``{M}x{N}x{K}`` in its canonical spelling (positive decimal integers, no leading zeros)."""
    m = re.fullmatch(r"([0-9]+)x([0-9]+)x([0-9]+)", name) if isinstance(name, str) else None
    if not m or min(int(g) for g in m.groups()) <= 0:
        raise ValueError(f"bad shape {name!r}: expected MxNxK with positive integers, e.g. 4096x4096x4096")
    dims = tuple(int(g) for g in m.groups())
    canonical = "x".join(map(str, dims))
    if canonical != name:
        raise ValueError(f"bad shape {name!r}: not the canonical spelling; write {canonical!r}")
    return dims  # type: ignore[return-value]


def compile_check_shape(shape: str, tile: Tile) -> str:
    """``shape`` (MxNxK) with K raised to whole K blocks for every CTA of ``tile`` (block_K · split_k): the shape
    at which the compile check builds a tile that a shorter K cannot take (a split tile: each CTA of its
    cluster needs K blocks of its own). Unchanged where K already divides into them."""
    M, N, K = parse_shape(shape)
    step = tile.block_K * tile.split_k
    return f"{M}x{N}x{-(-K // step) * step}"


# ---------------------------------------------------------------- what a block may use, per arch
# The most shared memory one block can have (static + dynamic, opt-in), in bytes: CUDA C++ Programming
# Guide, "Technical Specifications per Compute Capability". The one table every shared-memory rule uses
# (config-time estimates in harness/plan.py, the compiled kernel's usage in harness/compile.py).
SMEM_LIMIT_BYTES = {
    "sm_75": 64 * 1024,
    "sm_80": 163 * 1024, "sm_87": 163 * 1024,
    "sm_86": 99 * 1024, "sm_89": 99 * 1024,  # 101376: the L40S / RTX 40 opt-in maximum
    "sm_90": 227 * 1024, "sm_90a": 227 * 1024,  # 232448
    "sm_100": 227 * 1024, "sm_100a": 227 * 1024, "sm_103": 227 * 1024, "sm_103a": 227 * 1024,
    "sm_110": 227 * 1024, "sm_110a": 227 * 1024,
    "sm_120": 99 * 1024, "sm_120a": 99 * 1024, "sm_121": 99 * 1024, "sm_121a": 99 * 1024,
}
# static shared memory TileLang's kernels add from sm_90 on (mbarriers and scratch; 0 seen on sm_89,
# up to 2048 on sm_90a/sm_100a): the config-time estimates count dynamic memory only
STATIC_SMEM_RESERVE = {arch: 2048 for arch in SMEM_LIMIT_BYTES if int(arch[3:].rstrip("a")) >= 90}
# every arch above: 64 K 32-bit registers per SM (and per block), at most 255 per thread
REGISTERS_PER_BLOCK = 65536
MAX_REGISTERS_PER_THREAD = 255
MAX_THREADS_PER_BLOCK = 1024


def smem_limit(arch: str) -> int:
    """The most shared memory (bytes) a block can have on ``arch``; KeyError naming the table if unknown."""
    try:
        return SMEM_LIMIT_BYTES[arch]
    except KeyError:
        raise KeyError(f"no shared-memory limit known for {arch}: add it to kernels/tiles.py SMEM_LIMIT_BYTES") from None


def smem_problem(what: str, smem: int, arch: str, static: int | None = None) -> str | None:
    """Why ``smem`` bytes (``what``: the tile or kernel) do not fit a block of ``arch``, or None. ``static``:
    the static shared memory, when known (a compiled kernel); else the arch's usual reserve is counted."""
    limit = smem_limit(arch)
    extra = STATIC_SMEM_RESERVE.get(arch, 0) if static is None else static
    if smem + extra <= limit:
        return None
    plus = f" + {extra} static" if extra else ""
    return (f"{what}: needs {smem}{plus} bytes of shared memory, more than the {limit} a block can have on {arch} "
            "(kernels/tiles.py SMEM_LIMIT_BYTES); use fewer stages or a smaller block")


def register_problem(what: str, registers: int, threads: int) -> str | None:
    """Why ``registers`` per thread over ``threads`` threads cannot launch as one block, or None."""
    if registers > MAX_REGISTERS_PER_THREAD:
        return f"{what}: {registers} registers per thread, more than {MAX_REGISTERS_PER_THREAD}"
    if registers * threads > REGISTERS_PER_BLOCK:
        return (f"{what}: {registers} registers x {threads} threads = {registers * threads}, more than the "
                f"{REGISTERS_PER_BLOCK} registers of a block")
    return None


# The bounds a shape class may set (inclusive); MN is the number of outputs, M·N.
SHAPE_BOUNDS = ("M_max", "N_max", "K_max", "MN_max")


def shape_class(M: int, N: int, K: int, classes: list[dict]) -> str:
    """The name of the first class (config ``shape_classes``) whose bounds all hold for M x N x K."""
    values = {"M_max": M, "N_max": N, "K_max": K, "MN_max": M * N}
    for c in classes:
        if all(values[b] <= c[b] for b in SHAPE_BOUNDS if b in c):
            return c["name"]
    raise ValueError(f"shape {M}x{N}x{K} is in no shape class; the last class must have no bounds")
