"""Tiles, inputs, timing statistics and the judgement of a result."""
import pytest
import torch
from conftest import REPO

from harness.bench import summarize
from harness.inputs import load_operands, make_operands, manifest, save_operands
from harness.runner import judge
from kernels.tiles import parse_shape, parse_tile


def test_tile_names_round_trip():
    for name in ["m128n256k128_s3_t256", "m128n256k128_s4_t256_wrow_z8", "m64n64k128_s4_t128_wcol"]:
        assert parse_tile(name).name == name
    t = parse_tile("m128n256k64_s8_t256_wrow_z8")
    assert (t.block_M, t.block_N, t.block_K, t.num_stages, t.threads, t.policy, t.swizzle) == (128, 256, 64, 8, 256, "FullRow", 8)
    t = parse_tile("m8n64k512_s2_t128_wrow_split4")
    assert t.split_k == 4 and t.name == "m8n64k512_s2_t128_wrow_split4" and parse_tile("m8n64k512_s2_t128").split_k == 1


@pytest.mark.parametrize("bad, why", [("m8n64k512_s2_t128_split1", "write 'm8n64k512_s2_t128'"),
                                      ("m8n64k512_s2_t128_split0", "split_k must be positive"),
                                      ("m8n64k512_s2_t128_swapab_split2", "misplaced suffix '_swapab_split2'")])
def test_split_k_has_one_spelling(bad, why):
    with pytest.raises(ValueError, match=why):
        parse_tile(bad)


def test_only_a_splitting_kernel_takes_split_tiles():
    from kernels.registry import VARIANTS, load_all, tile_problem
    load_all()
    split = parse_tile("m128n128k128_s3_t256_split2")
    assert "does not split K" in tile_problem(VARIANTS["fp8_e4m3_ws"], split)
    assert "does not split K" in tile_problem(VARIANTS["int8_tilelang"], split)
    assert tile_problem(VARIANTS["dequant_w4_int4_sym_g128"], parse_tile("m16n64k256_s4_t128_wrow_split2")) is None


@pytest.mark.parametrize("bad", ["m128n256k128", "m128n256k128_s3_t100", "128x256", "m0n64k64_s2_t128"])
def test_bad_tile_names_are_named_in_the_error(bad):
    with pytest.raises(ValueError, match=bad):
        parse_tile(bad)


def test_shapes():
    assert parse_shape("16x8192x8192") == (16, 8192, 8192)
    with pytest.raises(ValueError, match="0x4x4"):
        parse_shape("0x4x4")


def test_inputs_are_deterministic_and_hashed(tmp_path):
    A1, B1 = make_operands("student_t3", 8, 16, 32, seed=7)
    A2, B2 = make_operands("student_t3", 8, 16, 32, seed=7)
    assert torch.equal(A1, A2) and torch.equal(B1, B2)
    A3, _ = make_operands("student_t3", 8, 16, 32, seed=8)
    assert not torch.equal(A1, A3)
    # the weight does not depend on M, so one B serves a sweep over M
    assert torch.equal(make_operands("normal", 4, 16, 32, 7)[1], make_operands("normal", 64, 16, 32, 7)[1])
    man = save_operands({"A": A1, "B": B1}, tmp_path / "x.pt")
    assert man == manifest({"A": A1, "B": B1})
    load_operands(tmp_path / "x.pt", man)
    man["A"]["sha256"] = "0" * 64
    with pytest.raises(ValueError, match=r"\['A'\].*sha256"):
        load_operands(tmp_path / "x.pt", man)


def test_heavy_tailed_distribution_has_heavier_tails():
    n, _ = make_operands("normal", 512, 1, 512, seed=0)
    t, _ = make_operands("student_t3", 512, 1, 512, seed=0)
    assert t.abs().max() > 3 * n.abs().max()


def test_unknown_distribution_is_named():
    with pytest.raises(ValueError, match="cauchy"):
        make_operands("cauchy", 4, 4, 4, 0)


def test_summary_quantiles():
    s = summarize([float(x) for x in range(1, 31)], "test")
    assert s["time_ms_median"] == 15.5 and s["reps"] == 30
    assert s["time_ms_p20"] == pytest.approx(6.8) and s["time_ms_p80"] == pytest.approx(24.2)


def test_judge_marks_tolerance_nan_and_inexact():
    tol = {"total_rel_fro": 0.05}
    assert judge({"total_rel_fro": 0.04}, tol) == []
    assert "total_rel_fro" in judge({"total_rel_fro": 0.06}, tol)[0]
    assert judge({"total_rel_fro": float("nan")}, tol)  # NaN never passes
    assert judge({"total_finite": False}, {}) == ["output has NaN/Inf"]
    assert judge({"exact": False}, {})
    assert judge({"check_extremes_exact": False}, {})


def test_trace_is_split_into_repetitions_at_each_flush():
    from harness.bench import split_by_flush

    flush = {"bitwise_not_kernel"}
    trace = [("warm_kernel", 5.0),  # before the first flush: not part of any repetition
             ("bitwise_not_kernel", 70.0), ("gemm", 100.0),
             ("bitwise_not_kernel", 70.0), ("dequant", 30.0), ("gemm", 90.0),
             ("bitwise_not_kernel", 70.0), ("gemm", 110.0)]
    assert split_by_flush(trace, flush) == [(("gemm",), 0.1), (("dequant", "gemm"), 0.12), (("gemm",), 0.11)]
    assert split_by_flush([], flush) == []


def _catalogue():
    import yaml

    return yaml.safe_load((REPO / "config.yaml").read_text())["platforms"]


def test_the_catalogue_tells_gpus_apart_by_their_nvidia_smi_names():
    from harness.device import matching_platforms

    platforms = _catalogue()
    assert {"h100", "h200", "b200", "l40s", "a100"} <= set(platforms)
    names = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100", "NVIDIA B200": "b200", "NVIDIA L40S": "l40s",
             "NVIDIA A100-SXM4-80GB": "a100"}
    for name, slug in names.items():
        assert matching_platforms(name, platforms) == [slug], name
    # a different product under a similar name has other peaks: it must not pass as a listed one
    for other in ("NVIDIA H200 NVL", "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-40GB", "NVIDIA GeForce RTX 4090"):
        assert matching_platforms(other, platforms) == [], other


def test_a_job_checks_the_gpu_it_landed_on(monkeypatch):
    import torch

    import harness.device as device

    spec = _catalogue()["h100"]
    monkeypatch.setenv("SLURMD_NODENAME", "gpu07")
    monkeypatch.setattr(device, "_nvidia_smi", lambda q: [])
    with pytest.raises(RuntimeError, match="planned for platform h100.*node gpu07 has no GPU.*platforms.h100.cluster"):
        device.check_landed("h100", spec)
    monkeypatch.setattr(device, "_nvidia_smi", lambda q: ["NVIDIA B200, 10.0"])
    with pytest.raises(RuntimeError, match="GPU mismatch.*platforms.h100.match.*node gpu07 has 'NVIDIA B200'"):
        device.check_landed("h100", spec)
    monkeypatch.setattr(device, "_nvidia_smi", lambda q: ["NVIDIA H100 80GB HBM3, 9.0"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
        device.check_landed("h100", spec)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda: (9, 0))
    assert device.check_landed("h100", spec) == {"gpu_name": "NVIDIA H100 80GB HBM3", "arch": "sm_90a", "node": "gpu07"}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda: (8, 9))
    with pytest.raises(RuntimeError, match="expects sm_90a"):
        device.check_landed("h100", spec)


def test_the_compile_check_raises_k_for_a_split_tile_only():
    from kernels.tiles import compile_check_shape
    assert compile_check_shape("256x256x512", parse_tile("m8n64k512_s2_t128_wrow_split2")) == "256x256x1024"
    assert compile_check_shape("256x256x512", parse_tile("m16n64k256_s4_t128_wrow_split2")) == "256x256x512"
    assert compile_check_shape("256x256x512", parse_tile("m128n256k128_s3_t256")) == "256x256x512"
