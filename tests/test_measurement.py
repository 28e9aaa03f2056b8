"""What a number claims: the timed window, the matched peer, the limits, the bytes, the keys, the status."""
import json

import pandas as pd
import pytest
import torch
from conftest import REPO

from harness import (
    bench,
    tables,  # noqa: E402
)
from harness.runner import classify_run_error, kernel_names, prepared
from kernels.registry import VARIANTS, bytes_per_element, get_format, get_variant, load_all

load_all()
FLUSH = "vectorized_elementwise_kernel<bitwise_not>"


# ---- 1. timing boundary -------------------------------------------------------------------------

def _trace(*rep: tuple[str, float], reps: int = 3) -> list[tuple[str, float]]:
    return [item for _ in range(reps) for item in [(FLUSH, 900.0), *rep]]


def test_a_foreign_kernel_in_a_tilelang_window_is_refused():
    # the old fp8 launch: the scale product (an elementwise mul) ran before the GEMM on every call
    split = bench.split_by_flush(_trace(("elementwise_mul", 1.2), ("main_kernel", 40.0)), {FLUSH})
    assert [t for _, t in split] == pytest.approx([0.0412] * 3)
    with pytest.raises(bench.ForeignKernel, match="elementwise_mul"):
        bench.window_kernels(split, own={"main_kernel"})
    clean = bench.split_by_flush(_trace(("main_kernel", 40.0)), {FLUSH})
    assert bench.window_kernels(clean, own={"main_kernel"}) == {"timed_kernels": "main_kernel", "kernels_per_rep": 1}


def test_a_library_window_is_reported_kernel_by_kernel():
    split = bench.split_by_flush(_trace(("decode_int4", 5.0), ("nvjet_gemm", 30.0)), {FLUSH})
    assert bench.window_kernels(split) == {"timed_kernels": "decode_int4;nvjet_gemm", "kernels_per_rep": 2}
    uneven = split[:2] + [(("nvjet_gemm",), 0.03)]
    with pytest.raises(bench.ForeignKernel, match="different kernels"):
        bench.window_kernels(uneven)
    with pytest.raises(bench.ForeignKernel, match="no kernel"):
        bench.window_kernels(bench.split_by_flush([(FLUSH, 1.0)], {FLUSH}))


def test_kernel_names_of_generated_source():
    src = ('extern "C" __global__ void __launch_bounds__(256, 1) main_kernel(int* a);\n'
           'extern "C" __global__ void __launch_bounds__(256, 1) main_kernel(int* a) {}\n'
           '__global__ void helper_kernel(float x) {}')
    assert kernel_names(src) == {"main_kernel", "helper_kernel"}


class Recording(dict):
    """Operands that remember which of them were read."""

    def __init__(self, *a):
        super().__init__(*a)
        self.read: set[str] = set()

    def __getitem__(self, k):
        self.read.add(k)
        return super().__getitem__(k)


def _fake_kernel(*args):
    return torch.zeros(1)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_launch_reads_exactly_what_its_format_counts(name):
    """The timed call reads the format's ``reads`` (or what prepare made from them) and nothing else;
    helper work (scale products, layout changes) happens in ``prepare``, once."""
    v = get_variant(name)
    fmt = get_format(v.input_format)
    g = torch.Generator().manual_seed(0)
    ops = Recording(fmt.quantize(torch.randn(128, 512, generator=g), torch.randn(256, 512, generator=g)))
    try:
        run_ops = prepared(v, ops)
        prepare_ran = True
    except RuntimeError:  # a CUDA-only library call (e.g. tinygemm's layout change); what it read is recorded
        run_ops, prepare_ran = dict(ops), False
    made = set(run_ops) - set(ops)
    run_ops = Recording(run_ops)
    try:
        v.launch(_fake_kernel if v.kernel is not None else None, run_ops)
    except (RuntimeError, NotImplementedError, ValueError):
        pass  # library calls may not run on the CPU; the operands they read were recorded first
    except KeyError:
        assert not prepare_ran, f"{name}: the launch reads a tensor neither its format nor its prepare makes"
    if not prepare_ran:  # the names the launch asked for beyond the stored operands are prepare's
        made |= run_ops.read - set(ops)
    assert (ops.read | run_ops.read) - made == set(fmt.reads), name


def test_fp8_launch_does_no_scale_arithmetic():
    v = get_variant("fp8_e4m3")
    ops = {"A": torch.zeros(2, 2), "B": torch.zeros(2, 2), "scale_a": torch.tensor([2.0]), "scale_b": torch.tensor([3.0])}
    run_ops = prepared(v, ops)
    assert float(run_ops["scale"]) == 6.0
    seen = []
    v.launch(lambda *args: seen.extend(args), run_ops)
    assert seen[2] is run_ops["scale"]  # the prepared tensor itself: no product inside the timed call


# ---- 2. peers matched by semantics --------------------------------------------------------------

def test_every_tilelang_variant_names_a_library_peer():
    for name, v in VARIANTS.items():
        if v.kernel is None:
            continue
        assert v.baseline in VARIANTS and VARIANTS[v.baseline].kernel is None, name
    for name in ("fp8_e4m3", "fp8_e5m2"):  # no promotion: fast accumulation is the peer
        assert get_variant(name).baseline == "cublas_fp8_e4m3_fastacc"
        assert get_variant(name).second_baseline == "cublas_fp8_e4m3"
    for name in ("blockscaled_sm90", "blockscaled_g128"):  # promoted: promoted cuBLAS
        assert get_variant(name).baseline == "cublas_blockwise_fp8"


def test_speedups_against_matched_peer_and_second_column():
    best = pd.DataFrame({
        "point_set": "all", "target": "sm_90a", "dist": "normal", "shape": "8x8x8", "family": "fp8", "tile": ["t", "lib", "lib"],
        "variant": ["fp8_e4m3", "cublas_fp8_e4m3_fastacc", "cublas_fp8_e4m3"], "throughput": [900.0, 1000.0, 800.0]})
    sp = tables.speedups(best, {"fp8_e4m3": "cublas_fp8_e4m3_fastacc"}, {"fp8_e4m3": "cublas_fp8_e4m3"})
    (row,) = sp.to_dict("records")
    assert row["baseline"] == "cublas_fp8_e4m3_fastacc" and row["speedup"] == pytest.approx(0.9)
    assert row["second_baseline"] == "cublas_fp8_e4m3" and row["speedup_vs_second"] == pytest.approx(1.125)


# ---- 3. ceilings that bound; 4. bytes --------------------------------------------------------------

H200 = {"name": "H200", "peak": {"fp8": 1979, "int8": 1979, "bf16": 989}, "hbm_TBps": 4.8, "source": "datasheet"}


def _rows(**cols) -> pd.DataFrame:
    base = {"entry": "x", "variant": "fp8_e4m3", "precision": "fp8", "status": "ok", "reason": "", "M": 8192, "N": 8192,
            "K": 8192, "shape": "8192x8192x8192", "tile": "t", "ops_unit": "TFLOP/s"}
    return pd.DataFrame([base | cols])


def test_pct_of_peak_is_taken_against_the_datasheet_and_measured_best_is_the_faster():
    df = _rows(throughput=1500.0, time_ms_median=0.73)
    probes = {"fp8_matmul": {"value": 1400.0, "precision": "fp8", "how": "cuBLAS", "unit": "TFLOP/s"}}
    out = tables.add_limits(df, probes, H200, {"fp8_e4m3": (1.0, 1.0, 2.0)})
    assert out["pct_of_peak"].iloc[0] == pytest.approx(100 * 1500 / 1979)
    assert out["measured_best"].iloc[0] == 1500.0  # the kernel beat the library probe
    r = tables.roofs(out, probes, H200)
    assert set(r["kind"]) == {"physical", "measured"}
    assert r[(r["kind"] == "measured") & (r["precision"] == "fp8")]["by"].iloc[0].startswith("x ")


def test_a_row_above_its_physical_roof_is_failed_not_published():
    # M=16: bound by reading the 67 MB weight; at 200 TFLOP/s that is 6.3 TB/s, more than HBM delivers
    df = _rows(M=16, shape="16x8192x8192", throughput=200.0, time_ms_median=0.0107)
    out = tables.add_limits(df, {}, H200, {"fp8_e4m3": (1.0, 1.0, 2.0)})
    assert out["status"].iloc[0] == "failed" and "exceeds the physical roof" in out["reason"].iloc[0]


def test_bytes_count_only_the_tensors_the_kernel_reads():
    # g128: A is 1 byte + one fp32 scale per 128 elements; SFA and SFA_t are the same scales twice
    a, b, c = bytes_per_element("blockscaled_g128")
    assert (a, b, c) == (1 + 4 / 128, 1 + 4 / 128, 2.0)
    a, b, _ = bytes_per_element("dequant_w4_int4_sym_g128")
    assert (a, b) == (2.0, 0.5 + 2 / 128)  # bf16 activations; 4-bit weight and a bf16 scale per 128


# ---- 5. unique keys -------------------------------------------------------------------------------

def _run_file(path, entry, variant="cublas_bf16"):
    point = {"platform": "h200", "target": "sm_90a", "variant": variant, "entry": entry, "family": "baseline",
             "dist": "normal", "shape": "16x8192x8192", "M": 16, "N": 8192, "K": 8192, "precision": "bf16",
             "ops_unit": "TFLOP/s", "input_sha256": {}}
    path.write_text(json.dumps({"point": point, "env": {}, "rows": [{"tile": "lib", "status": "ok", "reason": ""}]}))
    return str(path)


def test_collect_refuses_duplicate_keys_and_names_them(tmp_path):
    one = _run_file(tmp_path / "a.json", "cublas_bf16")
    two = _run_file(tmp_path / "b.json", "cublas_bf16_w4_shapes")  # same variant, another entry: distinct
    assert len(tables.tidy_runs([one, two])) == 2
    again = _run_file(tmp_path / "c.json", "cublas_bf16")
    with pytest.raises(tables.DuplicateRows, match=r"h200/all/sm_90a/cublas_bf16/normal/16x8192x8192/lib.*a\.json.*c\.json"):
        tables.tidy_runs([one, two, again])


# ---- 6. three statuses (run time) ---------------------------------------------------------------

def test_a_library_refusal_is_unsupported_only_when_it_is_a_known_one():
    v = get_variant("cublas_blockwise_fp8")
    status, reason = classify_run_error(v, RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul"))
    assert status == "unsupported" and "CUBLAS_STATUS_NOT_SUPPORTED" in reason
    assert classify_run_error(v, RuntimeError("CUDA error: an illegal memory access was encountered"))[0] == "failed"
    # the same cuBLAS message from a call that documents no such refusal is a failure
    assert classify_run_error(get_variant("cublas_bf16"), RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED"))[0] == "failed"
    assert classify_run_error(v, ValueError("bad tile"))[0] == "failed"


# ---- 9. the banner says what ran -------------------------------------------------------------------

def test_banner_facts_come_from_the_rows():
    gpu_all_failed = pd.DataFrame({"target": ["sm_90a"] * 2, "gpu_name": ["NVIDIA H200"] * 2,
                                   "throughput": [None, None], "status": ["failed", "unsupported"]})
    ran = tables.what_ran(gpu_all_failed)
    assert ran["gpus"] == ["NVIDIA H200"] and ran["gpu_rows"] == 2 and ran["timed_rows"] == 0
    cpu = pd.DataFrame({"target": ["cpu"], "gpu_name": ["none"], "throughput": [None], "status": ["ok"]})
    assert tables.what_ran(cpu)["gpu_rows"] == 0 and tables.what_ran(cpu)["emulated_rows"] == 1


# ---- 11. the published set ------------------------------------------------------------------------

PUBLISHED = REPO / "results/published/h200"


def test_published_set_keys_are_unique():
    tidy = pd.read_parquet(PUBLISHED / "tidy.parquet")
    assert not tidy.duplicated(tables.KEYS).any()


def test_published_set_never_exceeds_a_physical_limit():
    tidy = pd.read_parquet(PUBLISHED / "tidy.parquet")
    timed = tidy[tidy["throughput"].notna()]
    assert len(timed) > 100 and timed["peak"].notna().all() and timed["roof"].notna().all()
    assert (timed["pct_of_peak"] <= 100).all() and (timed["pct_of_roof"] <= 100).all()
    roofs = pd.read_csv(PUBLISHED / "roofs.csv")
    assert {"physical", "measured"} <= set(roofs["kind"])


def test_published_fp8_speedups_are_against_fast_accumulation():
    tidy = pd.read_parquet(PUBLISHED / "tidy.parquet")
    fp8 = tidy[tidy["variant"].isin(["fp8_e4m3", "fp8_e5m2"])]
    assert len(fp8) and (fp8["baseline"] == "cublas_fp8_e4m3_fastacc").all()
    best = tables.best_tiles(tidy)
    sp = tables.speedups(best, {"fp8_e4m3": "cublas_fp8_e4m3_fastacc"})
    assert sp["speedup"].notna().sum() >= 5
    # the TileLang kernels' windows held their own kernel only
    ok = tidy[(tidy["status"] == "ok") & tidy["tile"].ne("lib")]
    assert (ok["timed_kernels"] == "main_kernel").all()
