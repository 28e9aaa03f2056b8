"""blockscaled_sm90's warp-specialized kernel (kernels/blockscaled_sm90.py): its tile and shape rules, and
what the cross-compiled kernel contains (no GPU needed). Its numerics are blockscaled_sm90's emulation
(tests/test_blockscaled.py), which the GPU run compares the kernel with."""
import re

import pytest

from harness.compile import compile_record
from kernels import blockscaled_sm90 as bw
from kernels.registry import Unsupported, get_variant, tile_problem
from kernels.tiles import parse_tile
from kernels.warp_specialized import SMEM_BYTES, TMA_PRODUCER

V = get_variant("blockscaled_sm90")


@pytest.mark.parametrize("tile,problem", [
    ("m128n256k64_s3_t384", "block_K must be 128"),
    ("m128n200k128_s3_t384", "multiple of 16 up to 192, or 256"),
    ("m128n224k128_s2_t384", "multiple of 16 up to 192, or 256"),
    ("m128n176k128_s3_t384", "straddle three"),
    ("m128n256k128_s3_t384_p1", "no _p"),
    ("m64n64k128_s8_t256_swapab", "no _swapab"),
    ("m128n256k128_s4_t384", "shared memory"),
    ("m128n256k128_s3_t256", "threads must be 384"),
    ("m256n128k128_s3_t384", "block_M must be 64 or 128"),
    ("m128n128k128_s1_t384", "at least 2 stages"),
])
def test_tiles_the_kernel_cannot_take_are_refused(tile, problem):
    assert problem in tile_problem(V, parse_tile(tile))


@pytest.mark.parametrize("block_N,sub_N,offsets", [
    (64, 64, (0,)), (128, 128, (0,)), (256, 128, (0,)),  # never straddle: every partial within one scale block
    (192, 192, (0, 64)), (160, 160, (0, 32, 64, 96)), (96, 96, (0, 32, 64, 96)),
])
def test_a_partial_sum_straddles_two_b_scale_blocks_only_where_block_N_and_128_do_not_divide(block_N, sub_N, offsets):
    assert bw.sub_block_N(block_N) == sub_N
    assert bw.scale_offsets(block_N) == offsets
    # where the first column of a tile's partial (n·block_N + h·sub_N) lands in its scale block: each offset
    # listed, or (one offset: 0) never where the partial would cross into the next block
    starts = {(n * block_N + h * sub_N) % bw.SCALE_BLOCK for n in range(16) for h in range(block_N // sub_N)}
    if len(offsets) > 1:
        assert starts == set(offsets)
    else:
        assert all(o + min(sub_N, bw.SCALE_BLOCK) <= bw.SCALE_BLOCK for o in starts)


def test_shared_memory_counts_the_ring_with_its_row_scales_and_the_output_block():
    t = parse_tile("m128n256k128_s3_t384_z16")
    ring, scales, out = 3 * (128 + 256) * 128, 3 * 128 * 4, 128 * 256 * 2
    assert bw.blockscaled_sm90_smem_bytes(t) == ring + scales + out <= SMEM_BYTES
    assert tile_problem(V, t) is None
    assert bw.blockscaled_sm90_smem_bytes(parse_tile("m128n256k128_s4_t384")) > SMEM_BYTES


def test_the_tma_store_needs_n_divisible_by_8():
    assert V.shape_limit(256, 512, 1024) is None
    assert "N divisible by 8" in V.shape_limit(256, 516, 1024)
    with pytest.raises(Unsupported, match="N divisible by 8"):
        V.kernel(256, 516, 1024, parse_tile("m128n128k128_s3_t384"))


@pytest.fixture
def two_halves(kernels):
    k = kernels(V.name, "m128n256k128_s3_t384_z16")
    return k.record, k.source, k.sass


@pytest.fixture
def one_chain_straddling(kernels):
    k = kernels(V.name, "m128n192k128_s4_t384_z8")
    return k.record, k.source, k.sass


@pytest.fixture
def one_consumer(kernels):
    k = kernels(V.name, "m64n64k128_s8_t256")
    return k.record, k.source, k.sass


def _check_common(rec, src, sass, tile, wgmma_n):
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["smem_dynamic_bytes"] == bw.blockscaled_sm90_smem_bytes(parse_tile(tile))
    assert rec["sass_local_loads"] == rec["sass_local_stores"] == 0
    assert set(rec["sass_mma"]) == {f"QGMMA.64x{wgmma_n}x32.F32.E4M3.E4M3"}
    # A and B from the ring, a fresh partial per K block, drained before its promotion
    assert f"wgmma_ss<tl::DataType::kFloat8_e4m3, tl::DataType::kFloat8_e4m3, tl::DataType::kFloat32, 64, {wgmma_n}" in src
    assert "wait_wgmma<0>" in src and "wait_wgmma<1>" not in src
    # ptxas kept each batch's four wgmma k-steps in flight: one warpgroup wait per batch, not per k-step
    # (the serialization a partial read under wait_group 1 caused, C7514)
    assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x0") * 4 <= len(re.findall(r"\bQGMMA\b", sass))
    assert "tma_store" in src and "SFA_t_desc" in src  # A's row scales come through the TMA ring
    assert f"warpgroup_reg_dealloc<{TMA_PRODUCER.producer}>" in src


@pytest.mark.compile
def test_two_consumers_take_turns_and_promote_both_halves(two_halves):
    rec, src, sass = two_halves
    _check_common(rec, src, sass, "m128n256k128_s3_t384_z16", 128)
    assert f"warpgroup_reg_alloc<{TMA_PRODUCER.consumer[2]}>" in src
    # full: the 128 producer threads; empty: lane 0 of each of the 8 consumer warps
    assert "full[0].init(128);" in src and "empty[0].init(8);" in src and "full[3].init" not in src
    # the turn-taking named barriers, for both warpgroups
    for bar in bw.TURN:
        assert f"__named_barrier_arrive({bar}, 256)" in src and f"__sync_thread_partial({bar}, 256)" in src
    # promotion: acc += partial · (sa · sb), one FFMA per element (64 per thread per half, two halves, two
    # consumer warpgroups)
    assert len(re.findall(r"\bFFMA\b", sass)) >= 2 * 2 * 64


@pytest.mark.compile
def test_a_192_column_tile_is_one_wgmma_chain_with_the_b_scale_chosen_per_column(one_chain_straddling):
    rec, src, sass = one_chain_straddling
    _check_common(rec, src, sass, "m128n192k128_s4_t384_z8", 192)
    # two B scale rows per tile (the block of its first column and the next), the boundary a branch per offset
    assert "sb_row[1] = min((first + 1)," in src
    assert "if (off == 0)" in src and "if (off == 64)" in src
    # 96 FFMAs per thread per K block and consumer: nvcc merges the two branches, choosing the scale per column
    assert len(re.findall(r"\bFFMA\b", sass)) >= 4 * 2 * 96


@pytest.mark.compile
def test_the_ring_slots_are_written_out_so_every_stage_address_is_a_constant(one_chain_straddling, two_halves):
    for rec, src, _ in (one_chain_straddling, two_halves):
        # each tile starts at slot 0 and a round's slots are unrolled: the barriers are indexed by constants
        assert re.search(r"(full|empty)\[\(", src) is None and "full[1].wait(" in src and "empty[1].wait(" in src
        # one wgmma batch per slot, half and consumer warpgroup
        tile = parse_tile(rec["tile"])
        assert src.count("tl::warpgroup_arrive();") == tile.num_stages * 2 * (tile.block_N // bw.sub_block_N(tile.block_N))


@pytest.mark.compile
def test_one_consumer_needs_no_turns(one_consumer):
    rec, src, sass = one_consumer
    _check_common(rec, src, sass, "m64n64k128_s8_t256", 64)
    assert f"warpgroup_reg_alloc<{TMA_PRODUCER.consumer[1]}>" in src and "empty[0].init(4);" in src
    assert "__named_barrier_arrive" not in src


@pytest.mark.parametrize("arch", ["sm_89", "sm_100a"])
def test_blockscaled_sm90_is_declared_unsupported_without_wgmma(tmp_path, arch):
    rec = compile_record(V, 256, 512, 1024, parse_tile("m128n256k128_s3_t384_z16"), arch, tmp_path)
    assert rec["status"] == "unsupported" and "wgmma" in rec["reason"]
