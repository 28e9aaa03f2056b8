"""The dynamic shared memory each TileLang kernel needs for a tile, known before compiling: config
validation (harness/plan.py) refuses a tile over its target's limit (kernels/tiles.py SMEM_LIMIT_BYTES),
and every compile checks the built kernel's own figure again (harness/compile.py resource_check).

T.Pipelined keeps ``num_stages`` copies of every shared buffer its loop copies into; buffers used only
after the loop (the epilogue's C tile) reuse that memory (TileLang merges dynamic shared buffers by
liveness), so a pipelined kernel needs num_stages x its per-stage bytes. Checked against the compile
records of every kernel of config.yaml (results/published/h200/compile_matrix.csv): exact, or a few
hundred bytes under (buffer alignment).
"""
from __future__ import annotations

from kernels.tiles import Tile
from kernels.warp_specialized import has_producer


def pipelined_smem_bytes(tile: Tile, per_stage: float) -> int:
    return int(tile.num_stages * per_stage)


def _tn_smem(tile: Tile, operand_bytes: float, **_) -> int:
    """fp8_pipelined_kernel, int8_tilelang_kernel, int4_mma_kernel: A (block_M, block_K) and B (block_N, block_K) per stage."""
    return pipelined_smem_bytes(tile, (tile.block_M + tile.block_N) * tile.block_K * operand_bytes)


def _int4_unpack_s8_smem(tile: Tile, a_in_registers: bool = True, **_) -> int:
    """int4_unpack_s8_kernel: packed A and B of two K blocks per stage, plus the decoded int8 tiles (two K blocks)."""
    bM, bN, bK = tile.block_M, tile.block_N, tile.block_K
    return pipelined_smem_bytes(tile, (bM + bN) * bK) + 2 * bN * bK + (0 if a_in_registers else 2 * bM * bK)


def _blockscaled_pipelined_smem(tile: Tile, **_) -> int:
    """blockscaled_g128_kernel, blockscaled_sm100_kernel: fp8 A and B plus one 4-byte scale per row, per stage."""
    return pipelined_smem_bytes(tile, (tile.block_M + tile.block_N) * (tile.block_K + 4))


def _dequant_smem(tile: Tile, fmt=None, **_) -> int:
    """dequant_w4_kernel: per stage bf16 A, the packed 4-bit weight, the group scales (and zeros) of one K block;
    the overlapped form (a producer warpgroup) adds each consumer's staged output tile and, split, the partial
    sums its cluster reduction reads (the pipelined forms reuse the ring's memory for those)."""
    bM, bN, bK = tile.block_M, tile.block_N, tile.block_K
    groups = max(bK // fmt.group, 1)
    scale = 1 if fmt.scale == "e8m0" else 2
    zeros = 2 if fmt.has_zeros else 0
    ring = pipelined_smem_bytes(tile, bM * bK * 2 + bN * bK // 2 + groups * bN * (scale + zeros))
    if not has_producer(tile.threads, bN):
        return ring
    return ring + bM * bN * 2 + (bM * bN * 4 if tile.split_k > 1 else 0)


def _fp8_ws_smem(tile: Tile, **_) -> int:
    from kernels.fp8_ws import smem_bytes

    return smem_bytes(tile, 1, 2)


def _int4_ws_smem(tile: Tile, **_) -> int:
    from kernels.int4_ws import int4_ws_smem_bytes

    return int4_ws_smem_bytes(tile)


def _blockscaled_sm90_smem(tile: Tile, **_) -> int:
    from kernels.blockscaled_sm90 import blockscaled_sm90_smem_bytes

    return blockscaled_sm90_smem_bytes(tile)


# kernel factory (its __name__; registry.Variant.kernel, a functools.partial unwrapped) -> its rule; by
# name, so that this module imports no family module (they import it)
KERNEL_SMEM = {
    "fp8_pipelined_kernel": lambda tile, **kw: _tn_smem(tile, 1),
    "int8_tilelang_kernel": lambda tile, **kw: _tn_smem(tile, 1),
    "int4_mma_kernel": lambda tile, **kw: _tn_smem(tile, 0.5),
    "int4_unpack_s8_kernel": _int4_unpack_s8_smem,
    "blockscaled_g128_kernel": _blockscaled_pipelined_smem,
    "blockscaled_sm100_kernel": _blockscaled_pipelined_smem,
    "dequant_w4_kernel": _dequant_smem,
    "fp8_ws_kernel": _fp8_ws_smem,
    "int4_ws_kernel": _int4_ws_smem,
    "blockscaled_sm90_kernel": _blockscaled_sm90_smem,
}


def kernel_smem_bytes(kernel, tile: Tile) -> int:
    """The dynamic shared memory a TileLang variant's kernel factory (``Variant.kernel``) needs for ``tile``.
    KeyError for a factory without a rule: every TileLang kernel must have one (tests/test_config_checks.py)."""
    func, keywords = kernel, {}
    while hasattr(func, "func"):  # functools.partial
        keywords = {**func.keywords, **keywords}
        func = func.func
    if func.__name__ not in KERNEL_SMEM:
        raise KeyError(f"kernel {func.__module__}.{func.__name__} has no shared-memory rule: add one to "
                       "kernels/smem.py KERNEL_SMEM")
    return KERNEL_SMEM[func.__name__](tile, **keywords)
