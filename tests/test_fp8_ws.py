"""The warp-specialized skeleton (kernels/warp_specialized.py) and the fp8 kernel on it (kernels/fp8_ws.py):
the tile rules, the grouped raster, shape classes, and what the cross-compiled kernels contain (no GPU needed)."""
import re

import pytest

from harness.compile import compile_record
from kernels.fp8_ws import smem_bytes
from kernels.registry import get_variant, tile_problem
from kernels.tiles import parse_tile, shape_class
from kernels.warp_specialized import SMEM_BYTES, WGMMA_ONLY, grouped_tile, launch

CLASSES = [{"name": "m16", "M_max": 16}, {"name": "small", "MN_max": 4096 * 4096}, {"name": "large"}]


@pytest.mark.parametrize("m_blocks,n_blocks,group", [(1, 1, 8), (64, 32, 8), (64, 32, 16), (24, 20, 16), (7, 5, 3), (3, 40, 8), (5, 1, 2)])
def test_grouped_raster_visits_every_tile_once(m_blocks, n_blocks, group):
    seen = [grouped_tile(t, m_blocks, n_blocks, group) for t in range(m_blocks * n_blocks)]
    assert sorted(seen) == [(m, n) for m in range(m_blocks) for n in range(n_blocks)]
    # within a full group, consecutive tiles share an N block (the wave's B stays in L2)
    if m_blocks >= group:
        assert {n for _, n in seen[:group]} == {0} and {m for m, _ in seen[:group]} == set(range(group))


def test_tile_names_carry_promotion_and_operand_swap():
    t = parse_tile("m64n16k256_s10_t256_p2_swapab")
    assert (t.block_M, t.block_N, t.block_K, t.num_stages, t.threads, t.promote, t.swap_ab) == (64, 16, 256, 10, 256, 2, True)
    for name in ("m64n16k256_s10_t256_p2_swapab", "m128n256k128_s3_t384_z16", "m128n192k128_s4_t384_z16_p4"):
        assert parse_tile(name).name == name
    with pytest.raises(ValueError, match="_swapab"):
        parse_tile("m64n16k256_s10_t256_swapab_p2")  # the grammar's order: _z, _p, _swapab


def test_shape_classes_first_match_wins():
    assert shape_class(16, 8192, 8192, CLASSES) == "m16"
    assert shape_class(4096, 4096, 4096, CLASSES) == "small"  # bounds are inclusive
    assert shape_class(4096, 4097, 64, CLASSES) == "large"
    with pytest.raises(ValueError, match="the last class must have no bounds"):
        shape_class(32, 32, 32, CLASSES[:1])


@pytest.mark.parametrize("tile,variant,problem", [
    ("m256n128k128_s3_t640", "fp8_e4m3_ws", "block_M must be 64 or 128"),
    ("m128n256k128_s3_t256", "fp8_e4m3_ws", "threads must be 384"),
    ("m128n264k128_s3_t384", "fp8_e4m3_ws", "block_N must be a multiple of 8 in [8, 256]"),
    ("m128n256k48_s3_t384", "fp8_e4m3_ws", "block_K must be a multiple of 32"),
    ("m128n256k128_s1_t384", "fp8_e4m3_ws", "at least 2 stages"),
    ("m128n256k128_s3_t384_wrow", "fp8_e4m3_ws", "no warp policy"),
    ("m128n256k128_s4_t384", "fp8_e4m3_ws", "needs 262144 bytes of shared memory"),
    ("m128n192k128_s4_t384_p2", "fp8_e4m3_ws", "a _p<n> tile belongs to fp8_e4m3_ws_promoted"),
    ("m128n192k128_s4_t384", "fp8_e4m3_ws_promoted", "its tiles name n (_p<n>)"),
    ("m128n128k128_s3_t128_swapab", "fp8_e4m3", "plain tiles only"),
    ("m128n128k128_s3_t128_p2", "int8_tilelang", "plain tiles only"),
])
def test_tiles_a_kernel_cannot_take_are_refused(tile, variant, problem):
    assert problem in tile_problem(get_variant(variant), parse_tile(tile))


def test_shared_memory_budget_counts_the_ring_and_the_staged_output():
    assert smem_bytes(parse_tile("m128n256k128_s3_t384"), 1, 2) == 3 * 384 * 128 + 128 * 256 * 2
    assert smem_bytes(parse_tile("m64n16k256_s10_t256_swapab"), 1, 2) == 10 * 80 * 256  # stored from registers
    assert smem_bytes(parse_tile("m128n128k128_s6_t384"), 1, 2) <= SMEM_BYTES


def test_persistent_launch_size():
    s = launch(8192, 8192, 8192, parse_tile("m128n256k128_s3_t384_z16"), 0)
    assert (s.consumers, s.threads, s.tiles, s.grid, s.waves, s.k_blocks) == (2, 384, 2048, 132, 16, 64)
    s = launch(16, 8192, 8192, parse_tile("m64n16k256_s10_t256_swapab"), 0)  # rows tile N, columns tile M
    assert (s.m_blocks, s.n_blocks, s.grid, s.waves) == (128, 1, 128, 1)


# ---- what the cross-compiled kernels are made of ----------------------------------------------------


def _kernel(kernels, variant, tile, **shape):
    """The kernel's CUDA source and its compile record (SASS opcodes, spills), as the compile step writes them."""
    k = kernels(variant, tile, "sm_90a", **shape)
    assert k.record["status"] == "ok", k.record
    return k.source, k.record


@pytest.mark.compile
@pytest.mark.parametrize("variant,tile,kind", [
    ("fp8_e4m3_ws", "m128n256k128_s3_t384_z16", "E4M3"),
    ("fp8_e5m2_ws", "m128n128k128_s6_t384_z8", "E5M2"),
    ("fp8_e4m3_ws", "m64n16k256_s10_t256_swapab", "E4M3"),
    ("fp8_e4m3_ws_promoted", "m128n192k128_s4_t384_z16_p4", "E4M3"),
])
def test_the_mainloop_keeps_one_wgmma_batch_in_flight(kernels, variant, tile, kind):
    src, rec = _kernel(kernels, variant, tile)
    t = parse_tile(tile)
    # producer and consumers split the registers; consumers wait on the TMA's full barriers
    assert "warpgroup_reg_dealloc<40>" in src and "warpgroup_reg_alloc<" in src
    assert "tma_load(" in src and "full[((int64_t)slot" in src and "empty[prev].arrive();" in src
    # the wait after each batch leaves one in flight; only the tile's end (or a promotion) drains it
    assert "wait_wgmma<1>();" in src
    if not t.promote:
        assert src.count("wait_wgmma<0>();") == t.block_M // 64  # once per consumer warpgroup and tile
    # the epilogue: TMA store from shared memory, or (Cᵀ tiles) the transposed store from registers
    assert ("tma_store(" in src) != t.swap_ab
    tensor = rec["sass_mma"]
    assert tensor and all(re.fullmatch(rf"QGMMA\.64x{t.block_N}x32\.F32\.{kind}\.{kind}", op) for op in tensor), tensor
    assert rec["sass_local_loads"] + rec["sass_local_stores"] == 0  # no spills


@pytest.mark.parametrize("arch", ["sm_89", "sm_100a"])
def test_the_warp_specialized_variants_are_declared_unsupported_without_wgmma(tmp_path, arch):
    for name in ("fp8_e4m3_ws", "fp8_e5m2_ws", "fp8_e4m3_ws_promoted"):
        rec = compile_record(get_variant(name), 256, 256, 512, parse_tile("m128n192k128_s4_t384_p2"), arch, tmp_path)
        assert rec["status"] == "unsupported" and rec["reason"] == WGMMA_ONLY


@pytest.mark.compile
def test_the_promoted_kernel_adds_its_partial_sums_into_a_second_accumulator(kernels):
    # K 1024: eight K blocks, so that "every second one and the last" are two conditions
    src, _ = _kernel(kernels, "fp8_e4m3_ws_promoted", "m128n128k128_s6_t384_z8_p2", shape=(256, 256, 1024))
    # every second K block (and the last): drain, release both stages, then acc += part in fp32
    branch = re.search(r"if \(\(\(ki_\d+ & 1\) == 1\) \| \(ki_\d+ == 7\)\) \{\n(.*?)\n        \}", src, re.S)
    assert branch, src
    body = branch.group(1)
    # (the accumulator's name is TileLang's choice: it is allocated by a helper, tests/test_generated_cuda.py)
    add = re.search(r"v_ = \*\(float4\*\)\((\w+) \+ .*\n.*v__1 = \*\(float4\*\)\(target \+ .*\n\s*__1\.x = \(v_\.x\+v__1\.x\)", body)
    assert add and add.group(1) != "target", body
    assert body.index("wait_wgmma<0>();") < body.index("empty[prev].arrive();") < add.start()
