"""harness.tryout on a host without a GPU: the parallel compile records, and its refusals."""
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
        tryout._run({"fp8_e4m3_ws": []}, ["256x256x512"], [], None, None)
