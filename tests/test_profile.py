"""Nsight Compute profiles: the summary parser on a real H200 export, the ncu command line, the profile
target's refusals before anything runs, and the report's table of profiles."""
import json
import re
import shutil

import pandas as pd
import pytest
from conftest import REPO, TINY_TILE, copy_workflow, fake_nvidia_smi, on_path, snakemake, tiny_config

from harness import profile, tables
from harness.plan import Plan, UnplannedTarget, validate

# `ncu --import R --csv --page raw` of the pipeline's profile of fp8_e4m3 (tile m128n256k128_s4_t256_wrow_z8)
# at 8192x8192x8192 on the H200 (Nsight Compute 2025.3.1.0), as the profile rule wrote it
FIXTURE = REPO / "tests/fixtures/ncu_raw_h200_fp8_e4m3_8192.csv"
COUNTED = 3 * 8192 * 8192 + 0.0  # e4m3 A and B (1 byte each), bf16 C (2 bytes); the scales are 8 bytes


@pytest.fixture(scope="module")
def raw() -> pd.DataFrame:
    return profile.parse_raw(FIXTURE.read_text())


def test_parse_raw_scales_units_and_keeps_text(raw):
    assert len(raw) == 1 and raw["Kernel Name"].iloc[0] == "main_kernel"
    assert raw["gpu__time_duration.sum"].iloc[0] == pytest.approx(799.84)  # us
    assert raw["dram__bytes_read.sum"].iloc[0] == pytest.approx(645.658624e6)  # Mbyte -> bytes
    assert raw["gpc__cycles_elapsed.max.per_second"].iloc[0] == pytest.approx(1586.212)  # Ghz -> MHz
    assert raw["launch__grid_size"].iloc[0] == 2048  # "2,048" in the export


def test_summary_of_a_real_h200_export(raw):
    s = profile.summarize(raw, COUNTED)
    (k,) = s["kernels"]
    assert s["kernel_names"] == ["main_kernel"] and s["launches"] == 1 and s["main_kernel"] == "main_kernel"
    assert s["duration_us"] == pytest.approx(799.84)
    assert (s["dram_read_bytes"], s["dram_write_bytes"]) == (645658624, 128759808)
    assert s["dram_over_counted"] == pytest.approx((645658624 + 128759808) / COUNTED)
    assert k["sm_throughput_pct"] == pytest.approx(81.05568) and k["tensor_pipe_pct"] == pytest.approx(81.05568)
    assert k["dram_throughput_pct"] == pytest.approx(20.121056)
    assert k["achieved_occupancy_pct"] == pytest.approx(17.363576) and k["theoretical_occupancy_pct"] == 18.75
    assert k["registers_per_thread"] == 168 and k["block_size"] == 384 and k["sm_clock_mhz"] == pytest.approx(1586.212)
    assert [x["reason"] for x in k["top_stalls"]] == ["barrier", "long_scoreboard", "wait"]
    assert k["top_stalls"][0]["cycles_per_issue"] == pytest.approx(9.977)
    assert "selected" not in {x["reason"] for x in profile.summarize(raw, None, top=30)["kernels"][0]["top_stalls"]}
    assert s["limiter"] == k["limiter"] == "tensor pipe (81% of peak)"
    assert profile.summarize(raw, None)["dram_over_counted"] is None


def test_limiter_busiest_unit_or_latency():
    k = {"tensor_pipe_pct": 40.0, "dram_throughput_pct": 85.0, "l2_throughput_pct": 50.0, "l1_throughput_pct": 20.0}
    assert profile.limiter(k) == "DRAM (85% of peak)"
    slow = {**k, "dram_throughput_pct": 24.0, "top_stalls": [{"reason": "long_scoreboard", "cycles_per_issue": 2.0}]}
    assert profile.limiter(slow) == ("latency (no unit at 60% of peak; busiest L2 50%; top stall long_scoreboard)")
    assert profile.limiter({}).startswith("unknown")


def test_empty_exports_are_refused():
    header = FIXTURE.read_text().splitlines()[:2]  # column names and units, no launch
    with pytest.raises(ValueError, match="no kernel launch"):
        profile.parse_raw("\n".join(header) + "\n")
    with pytest.raises(ValueError, match="no kernel launch"):
        profile.parse_raw(header[0] + "\n")


def test_ncu_command_leaves_clocks_alone_and_filters_the_variant():
    cmd = profile.ncu_command("ncu", "out.ncu-rep", ["main_kernel"], ["python", "-m", "harness.profile"])
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--nvtx-include") + 1] == f"{profile.NVTX_RANGE}/"
    assert cmd[cmd.index("--kernel-name") + 1] == "regex:^(main_kernel)$"
    assert cmd[cmd.index("--export") + 1] == "out.ncu-rep" and cmd[-3:] == ["python", "-m", "harness.profile"]
    # a library baseline: its kernels are whatever cuBLAS launches inside the range
    assert "--kernel-name" not in profile.ncu_command("ncu", "o", None, ["x"])


def test_profile_table_lists_each_summary(tmp_path):
    s = profile.summarize(profile.parse_raw(FIXTURE.read_text()), COUNTED)
    point = {"entry": "fp8_e4m3", "dist": "normal", "shape": "8192x8192x8192", "tile": "m128n256k128_s4_t256_wrow_z8",
             "target": "sm_90a"}
    f = tmp_path / "profile/fp8_e4m3/normal/8192x8192x8192/m128n256k128_s4_t256_wrow_z8.summary.json"
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps({"point": point, "profile": {"ncu": "2025.3.1.0"}, "env": {"git_commit": "abc"}, **s}))
    (f.parent / "broken.summary.json").write_text("{")
    t = tables.profile_table(tmp_path)
    ok = t[t["entry"] == "fp8_e4m3"].iloc[0]
    assert ok["limiter"] == "tensor pipe (81% of peak)" and ok["dram_over_counted"] == pytest.approx(s["dram_over_counted"])
    assert ok["top_stalls"].startswith("barrier 9.98") and ok["git_commit"] == "abc"
    assert t[t["entry"].isna()]["limiter"].iloc[0].startswith("unreadable")
    assert tables.profile_table(tmp_path / "nothing").empty


PROFILE_CONFIG = tiny_config() | {"sweeps": tiny_config()["sweeps"] | {"gpu": ["8192x8192x8192"]}}


@pytest.mark.parametrize("point,words", [
    (("fp8_e4m3", "normal", "8192x8192x8192", "m1n1k1_s1"), "fp8_e4m3 times no tile on sm_90a 'm1n1k1_s1'"),
    (("fp8_e4m3", "normal", "64x64x64", TINY_TILE), "fp8_e4m3 times no shape '64x64x64'"),
    (("cublas_bf16", "normal", "8192x8192x8192", "m128n256k128_s4_t256_wrow_z8"),
     "cublas_bf16 times no tile on sm_90a 'm128n256k128_s4_t256_wrow_z8'; it times: lib"),
    (("fp9", "normal", "8192x8192x8192", "lib"), "no config entry 'fp9'"),
])
def test_a_profile_of_a_point_that_is_not_timed_is_refused(point, words):
    plan = Plan(validate(PROFILE_CONFIG, check_shapes=False))
    with pytest.raises(UnplannedTarget, match=re.escape(f"results/h200/profile/{'/'.join(point)}: {words}")):
        plan.check_profile_point("h200", *point)


@pytest.mark.workflow
def test_profile_target_is_refused_before_anything_runs(tmp_path):
    """Through Snakemake: the profile rule's own check (a local run on a host without that GPU), and the
    message of a refusal reaches the user, before any job ran."""
    if shutil.which("nvidia-smi"):
        pytest.skip("a host with a GPU: the no-GPU refusal is not what it gets")
    wf = copy_workflow(tmp_path, PROFILE_CONFIG)
    for target, words in (
            (f"results/h200/profile/fp8_e4m3/normal/8192x8192x8192/{TINY_TILE}.summary.json",
             "profiling runs on a h200 GPU (config platforms.h200.match), and this host has no GPU; nothing was run"),
            ("results/h200/profile/fp8_e4m3/normal/64x64x64/m64n64k64_s2_t128.summary.json",
             "fp8_e4m3 times no shape '64x64x64'")):
        proc = snakemake(wf, target, check=False)
        assert proc.returncode != 0 and words in " ".join((proc.stdout + proc.stderr).split()), proc.stderr[-3000:]
    assert not (wf / "results/inputs").exists() and not (wf / "results/compile").exists()  # nothing ran


@pytest.mark.workflow
def test_published_profiles_are_sources_no_report_rebuilds(tmp_path, monkeypatch):
    # on a host where profiling could run (an H200, faked: nvidia-smi is all that planning asks), a report
    # that lists the published profiles must not plan re-profiling them (committed sources, like points)
    on_path(monkeypatch, fake_nvidia_smi(tmp_path, "NVIDIA H200", "9.0"))
    cfg = tiny_config() | {"report": {"compare_with": ["results/published/h200"], "regression_threshold": 0.05}}
    wf = copy_workflow(tmp_path / "wf", cfg)
    assert list((wf / "results/published/h200/profile").rglob("summary.json"))
    proc = snakemake(wf, "-n", "results/cpu/report.html")
    out = proc.stdout + proc.stderr
    assert "rule report:" in out, out[-2000:]
    assert "rule profile:" not in out and "rule publish_profile:" not in out, out[-3000:]
