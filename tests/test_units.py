"""Tiles, inputs, timing statistics and the judgement of a result."""
import pytest
import torch

from kernels.bench import summarize
from kernels.inputs import load_operands, make_operands, manifest, save_operands
from kernels.runner import judge
from kernels.tiles import parse_shape, parse_tile


def test_tile_names_round_trip():
    for name in ["m128n256k128_s3_t256", "m128n256k128_s4_t256_wrow_z8", "m64n64k128_s4_t128_wcol"]:
        assert parse_tile(name).name == name
    t = parse_tile("m128n256k64_s8_t256_wrow_z8")
    assert (t.block_M, t.block_N, t.block_K, t.num_stages, t.threads, t.policy, t.swizzle) == (128, 256, 64, 8, 256, "FullRow", 8)


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
    from kernels.bench import split_by_flush

    flush = {"bitwise_not_kernel"}
    trace = [("warm_kernel", 5.0),  # before the first flush: not part of any repetition
             ("bitwise_not_kernel", 70.0), ("gemm", 100.0),
             ("bitwise_not_kernel", 70.0), ("dequant", 30.0), ("gemm", 90.0),
             ("bitwise_not_kernel", 70.0), ("gemm", 110.0)]
    assert split_by_flush(trace, flush) == [(("gemm",), 0.1), (("dequant", "gemm"), 0.12), (("gemm",), 0.11)]
    assert split_by_flush([], flush) == []


def test_a_gpu_platform_without_its_gpu_is_an_error(monkeypatch):
    import torch

    from kernels.device import check_platform, platform_slug

    assert check_platform("cpu", None) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="h200.*no CUDA GPU"):
        check_platform("h200", "sm_90a")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda: (8, 9))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "NVIDIA L40S")
    with pytest.raises(RuntimeError, match="mismatch.*L40S"):
        check_platform("h200", "sm_90a")
    assert platform_slug("NVIDIA H200") == "h200" and platform_slug("NVIDIA GeForce RTX 4090") == "rtx4090"
