"""Cross-compilation without a GPU: instructions, resources, unsupported targets."""
import dataclasses

import pytest

from kernels.compile import compile_record
from kernels.registry import get_variant
from kernels.tiles import parse_tile

pytestmark = pytest.mark.compile
TILE = parse_tile("m64n64k64_s2_t128")


@pytest.mark.parametrize("variant,tag", [("fp8_e4m3", "kFloat8_e4m3"), ("fp8_e5m2", "kFloat8_e5m2")])
def test_hopper_fp8_kernel_uses_wgmma(tmp_path, variant, tag):
    rec = compile_record(get_variant(variant), 128, 128, 256, TILE, "sm_90a", tmp_path)
    assert rec["status"] == "ok", rec
    assert "wgmma" in rec["instructions"] and "mma_sync" not in rec["instructions"]
    assert tag in (tmp_path / "kernel.cu").read_text()
    assert (tmp_path / "kernel.ptx").stat().st_size > 0
    assert rec["registers"] > 0 and rec["smem_dynamic_bytes"] > 0


def test_a_silent_fallback_fails_loudly(tmp_path):
    # sm_89 has no wgmma: a variant that demands it there must be marked failed, not ok
    strict = dataclasses.replace(get_variant("fp8_e4m3"), instructions={"sm_89": "wgmma"})
    rec = compile_record(strict, 128, 128, 256, TILE, "sm_89", tmp_path)
    assert rec["status"] == "failed" and "wgmma" in rec["reason"]
    assert rec["instructions"] == ["mma_sync"]


def test_declared_unsupported_target_is_recorded_not_raised(tmp_path):
    v = dataclasses.replace(get_variant("fp8_e4m3"), unsupported={"sm_90a": "no reason at all"})
    rec = compile_record(v, 128, 128, 256, TILE, "sm_90a", tmp_path)
    assert (rec["status"], rec["reason"]) == ("unsupported", "no reason at all")


def test_compiler_refusal_is_unsupported_with_reason(tmp_path):
    # 3 consumer warpgroups of 64x256 fp32 accumulators do not fit the register file
    rec = compile_record(get_variant("fp8_e4m3"), 384, 512, 256, parse_tile("m192n256k128_s3_t384_wrow"), "sm_90a", tmp_path)
    assert rec["status"] == "unsupported" and rec["reason"]
