"""harness.tryout on a host without a GPU: the parallel compile records, and its refusals."""
import json

import pytest

from harness import tryout


@pytest.mark.compile
def test_compile_only_reports_each_tiles_build(capsys, tmp_path):
    """Compiles in tryout's own worker processes (config tiles at the compile-check shape: under .ci/run they
    come from the main job's kernel cache, which the suite's is seeded with)."""
    out = tmp_path / "rows.json"
    assert tryout.main(["--compile-only", "--jobs", "2", "--shapes", "256x256x512", "--json", str(out), "--variant",
                        "fp8_e4m3_ws", "m128n256k128_s3_t384_z16", "m64n16k256_s10_t256_swapab"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "fp8_e4m3_ws" in ln]
    assert len(lines) == 2 and all(" ok " in ln and "spills=0" in ln for ln in lines), lines
    assert "QGMMA.64x256x32.F32.E4M3.E4M3" in lines[0] and "QGMMA.64x16x32.F32.E4M3.E4M3" in lines[1]
    assert '"status": "ok"' in out.read_text()


@pytest.mark.parametrize("argv,message", [
    (["--variant", "fp8_e4m3_ws", "m128n256k128_s4_t384"], "needs 262144 bytes of shared memory"),
    (["--variant", "cublas_fp8_e4m3", "lib"], "give a TileLang variant and at least one tile"),
    (["--variant", "fp8_e4m3_ws"], "give a TileLang variant and at least one tile"),
])
def test_bad_requests_are_refused_before_any_compile(argv, message):
    with pytest.raises(SystemExit, match=message):
        tryout.main(["--shapes", "256x256x512", *argv])


def test_timing_needs_a_gpu():
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    with pytest.raises(SystemExit, match="no GPU here"):
        tryout._run([("256x256x512", {"fp8_e4m3_ws": []})], [], None, None, None)


def test_a_plan_gives_each_shape_its_own_tiles_in_the_files_order(tmp_path):
    plan = tmp_path / "tries.txt"
    plan.write_text("# decode first\n"
                    "1x8192x8192 dequant_w4_int4_sym_g128 m8n64k512_s2_t128_wrow_split2  # the decode form\n"
                    "256x8192x8192 dequant_w4_int4_sym_g128 m256n128k64_s4_t384_wrow\n"
                    "\n"
                    "1x8192x8192 dequant_w4_int4_sym_g128 m8n64k256_s4_t256_wrow_split2 m8n64k512_s2_t128_wrow_split2\n")
    assert tryout.read_plan(str(plan)) == [
        ("1x8192x8192", {"dequant_w4_int4_sym_g128": ["m8n64k512_s2_t128_wrow_split2", "m8n64k256_s4_t256_wrow_split2"]}),
        ("256x8192x8192", {"dequant_w4_int4_sym_g128": ["m256n128k64_s4_t384_wrow"]}),
    ]


@pytest.mark.parametrize("text,message", [
    ("1x8192x8192 dequant_w4_int4_sym_g128\n", r"tries.txt:1: expected 'SHAPE VARIANT TILE"),
    ("\n1x8192 dequant_w4_int4_sym_g128 m8n64k512_s2_t128_wrow\n", r"tries.txt:2: "),
    ("# nothing\n", "no 'SHAPE VARIANT TILE' line"),
    ("256x256x512 fp8_e4m3_ws m128n256k128_s3_t384_z16_split2\n", "does not split K"),  # the variant's tile check
])
def test_a_bad_plan_is_refused_with_its_line_before_any_compile(tmp_path, text, message):
    plan = tmp_path / "tries.txt"
    plan.write_text(text)
    with pytest.raises(SystemExit, match=message):
        tryout.main(["--plan", str(plan)])


def test_a_plan_replaces_shapes_and_variants(tmp_path):
    plan = tmp_path / "tries.txt"
    plan.write_text("256x256x512 fp8_e4m3_ws m128n256k128_s3_t384_z16\n")
    with pytest.raises(SystemExit, match="--plan replaces --shapes and --variant"):
        tryout.main(["--plan", str(plan), "--shapes", "256x256x512"])
    with pytest.raises(SystemExit, match="give --shapes and --variant, or --plan"):
        tryout.main(["--shapes", "256x256x512"])


@pytest.mark.compile
def test_compile_only_with_a_plan_builds_every_line(capsys, tmp_path):
    plan, out = tmp_path / "tries.txt", tmp_path / "rows.json"
    plan.write_text("256x256x512 fp8_e4m3_ws m128n256k128_s3_t384_z16\n"
                    "256x256x1024 dequant_w4_int4_sym_g128 m16n64k256_s4_t256_wrow_split2\n")
    assert tryout.main(["--compile-only", "--jobs", "2", "--plan", str(plan), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["shape"], r["variant"], r["status"]) for r in rows] == [
        ("256x256x512", "fp8_e4m3_ws", "ok"), ("256x256x1024", "dequant_w4_int4_sym_g128", "ok")]
