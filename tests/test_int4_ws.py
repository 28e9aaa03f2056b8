"""int4_ws (kernels/int4_ws.py): the 16·q decode proven exact, the kernel's arithmetic replayed on the CPU
(the decoded K order, the factor 256 and its shift, the accumulator bound), the tile and shape rules, and
what the cross-compiled kernel contains (no GPU needed)."""
import re

import pytest
import torch

from harness.compile import compile_record
from kernels import int4_ws
from kernels.formats import pack_int4, unpack_int4
from kernels.registry import Unsupported, get_variant, tile_problem
from kernels.tiles import parse_tile
from kernels.warp_specialized import DECODING_PRODUCER, SMEM_BYTES

V = get_variant("int4_ws")


def _lanes(words: torch.Tensor) -> torch.Tensor:
    """The four byte lanes of 32-bit words (int64 tensor), as int8 values (two's complement)."""
    lanes = torch.stack([(words >> (8 * i)) & 0xFF for i in range(4)], dim=-1)
    return torch.where(lanes >= 128, lanes - 256, lanes)


def _decode(packed: torch.Tensor, block_K: int) -> torch.Tensor:
    """Packed int4 rows (int8 (rows, K/2)) -> int8 values as the kernel decodes them: 16·q, and within each
    K block column j < block_K/2 from the low nibble of packed byte j, column block_K/2 + j from its high
    nibble. Built word by word with ``sixteen_q``, the expression the kernel traces."""
    rows, half_k = packed.shape
    words = packed.contiguous().view(torch.int32).long() & 0xFFFFFFFF  # (rows, K/8), little-endian bytes
    out = []
    for k0 in range(0, half_k // 4, block_K // 8):
        block = words[:, k0:k0 + block_K // 8]
        low = _lanes(int4_ws.sixteen_q(block, int, int4_ws.LOW_NIBBLES)).reshape(rows, -1)
        high = _lanes(int4_ws.sixteen_q(block, int, int4_ws.HIGH_NIBBLES)).reshape(rows, -1)
        out += [low, high]
    return torch.cat(out, dim=-1)


def test_sixteen_q_is_exact_for_every_byte_in_every_lane():
    values = torch.arange(256)
    for lane in range(4):
        words = values << (8 * lane) | (0xA5A5A5A5 & ~(0xFF << (8 * lane)))  # the other lanes hold noise
        low = _lanes(int4_ws.sixteen_q(words, int, int4_ws.LOW_NIBBLES))[:, lane]
        high = _lanes(int4_ws.sixteen_q(words, int, int4_ws.HIGH_NIBBLES))[:, lane]
        nibbles = unpack_int4(values.to(torch.uint8).view(torch.int8)[:, None]).long()  # [low, high] as int4
        assert torch.equal(low, 16 * nibbles[:, 0]) and torch.equal(high, 16 * nibbles[:, 1]), lane


@pytest.mark.parametrize("bK", [32, 64, 128])
def test_the_kernels_arithmetic_gives_the_exact_product(bK):
    """Both operands decoded in the kernel's K order and scaled by 16: the int32 sum is 256·C, exactly."""
    g = torch.Generator().manual_seed(3)
    M, N, K = 24, 40, 384
    a = torch.randint(-8, 8, (M, K), generator=g, dtype=torch.int8)
    b = torch.randint(-8, 8, (N, K), generator=g, dtype=torch.int8)
    da, db = _decode(pack_int4(a), bK), _decode(pack_int4(b), bK)
    assert not torch.equal(da // 16, a.long())  # the decoded order is not the logical one ...
    assert torch.equal(da.sort(dim=1).values, 16 * a.long().sort(dim=1).values)  # ... but holds the same values
    acc = da @ db.T
    assert torch.equal(acc >> 8, a.long() @ b.long().T) and not (acc & 0xFF).any()


def test_the_accumulator_bound_is_the_shape_limit():
    worst = 256 * 64  # all -8 x all -8: (16·-8)·(16·-8) per term
    k_max = int4_ws.MAX_EXACT_K - 32  # the largest K the limit accepts (a multiple of 32)
    assert V.shape_limit(64, 64, k_max) is None and worst * k_max < 2**31
    assert worst * int4_ws.MAX_EXACT_K >= 2**31
    assert "below 2^17" in V.shape_limit(64, 64, int4_ws.MAX_EXACT_K)
    assert "multiple of 32" in V.shape_limit(64, 64, 48)
    assert "multiple of 4" in V.shape_limit(64, 66, 64)
    with pytest.raises(Unsupported, match="multiple of 4"):
        V.kernel(64, 66, 64, parse_tile("m128n256k128_s3_t384"))


@pytest.mark.parametrize("tile,problem", [
    ("m128n256k128_s3_t384_p2", "no promotion"),
    ("m64n64k128_s8_t256_swapab", "operand swap"),
    ("m128n256k48_s3_t384", "multiple of 32"),
    ("m128n256k128_s4_t384", "shared memory"),
    ("m128n256k128_s3_t256", "threads must be 384"),
    ("m128n256k128_s1_t384", "at least 2 stages"),
])
def test_tiles_the_kernel_cannot_take_are_refused(tile, problem):
    assert problem in tile_problem(V, parse_tile(tile))


def test_shared_memory_counts_both_rings_and_the_output_buffers():
    t = parse_tile("m128n256k128_s3_t384_z8")
    assert int4_ws.packed_stages(t) == 4
    packed, decoded, staged = 4 * (128 + 256) * 64, 3 * 256 * 128, 2 * 2 * 64 * 32 * 4
    assert int4_ws.int4_ws_smem_bytes(t) == packed + decoded + staged <= SMEM_BYTES
    assert tile_problem(V, t) is None


@pytest.fixture
def compiled(kernels):
    k = kernels(V.name, "m128n256k128_s3_t384_z8")
    return k.record, k.source, k.sass


@pytest.mark.compile
def test_the_compiled_kernel_overlaps_the_decode_with_the_wgmma(compiled):
    rec, src, sass = compiled
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["smem_dynamic_bytes"] == int4_ws.int4_ws_smem_bytes(parse_tile("m128n256k128_s3_t384_z8"))
    assert rec["sass_local_loads"] == rec["sass_local_stores"] == 0
    assert set(rec["sass_mma"]) == {"IGMMA.64x256x32.S8.S8"}
    # A from registers, B from the decoded shared tile; the batch stays in flight while the next block decodes
    assert "wgmma_rs<tl::DataType::kInt8, tl::DataType::kInt8, tl::DataType::kInt32, 64, 256, 32" in src
    assert "wait_wgmma<1>" in src and "warpgroup_wait<" not in src
    # the producer/consumer register split, the four barrier rings with their arrival counts
    assert f"warpgroup_reg_dealloc<{DECODING_PRODUCER.producer}>" in src and f"warpgroup_reg_alloc<{DECODING_PRODUCER.consumer[2]}>" in src
    for ring, count in (("loaded", 32), ("packed_free", int4_ws.DECODERS + 8), ("full", int4_ws.DECODERS), ("decoded_free", 8)):
        assert f"{ring}[0].init({count});" in src, ring
    assert "loaded[3].init" in src and "full[3].init" not in src  # the packed ring is one stage deeper
    # the decode: two logic operations per 4 values (shift, mask), and the exact shift back in the epilogue
    assert len(re.findall(r"LOP3\.LUT R\d+, R\d+, 0xf0f0f0f0", sass)) >= 16
    assert re.search(r"SHF\.R\.S32\.HI R\d+, RZ, 0x8,", sass)
    assert "tma_store" in src
    # the decoders' loads are issued in batches, not one per step
    runs = re.findall(r"(?:L)+", "".join(op[0] for op in re.findall(r"\b(LDS|STS)\.128\b", sass)))
    assert runs and max(map(len, runs)) == int4_ws.DECODE_BATCH


@pytest.mark.parametrize("arch", ["sm_89", "sm_100a"])
def test_int4_ws_is_declared_unsupported_without_wgmma(tmp_path, arch):
    rec = compile_record(V, 256, 256, 512, parse_tile("m128n256k128_s3_t384_z8"), arch, tmp_path)
    assert rec["status"] == "unsupported" and "wgmma" in rec["reason"]
