"""Faults and bad input (issue 11): a corrupt file is detected and named, one bad shape keeps the others'
results, every failure is listed on the console with its log, and a valid config never crashes a job."""
import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, on_path, snakemake, tiny_config

from harness.plan import ConfigError, Plan, validate


def flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.workflow
def test_a_corrupt_input_fails_its_shape_only_and_is_named(tiny_run_copy):
    wf = tiny_run_copy
    good, bad = (f"results/cpu/fp8_e4m3/normal/{s}.json" for s in ("64x128x128", "48x64x128"))
    corrupt = wf / "results/inputs/normal/48x64x128/formats/fp8_e4m3_tensor.pt"
    flip_byte(corrupt)
    # the scheduler sees the changed file (a directory() output hid it): the run job is planned again
    plan = snakemake(wf, "-n", good)
    assert "emulate_fp8_e4m3" in plan.stdout and "Nothing to be done" not in plan.stdout + plan.stderr

    proc = snakemake(wf, "-f", good)  # asked for the good shape: the job covers both
    ok = json.loads((wf / good).read_text())
    assert [r["status"] for r in ok["rows"]] == ["ok"]
    failed = json.loads((wf / bad).read_text())
    (row,) = failed["rows"]
    assert row["status"] == "failed" and row["tile"] == "emulated"
    assert str(corrupt.relative_to(wf)) in row["reason"] and "snakemake --cores 1 -f" in row["reason"]
    # the end of the run lists the failure and the log holding its traceback
    console = proc.stdout + proc.stderr
    assert "1 failed row(s)" in console and bad in console
    assert "log: results/logs/cpu/fp8_e4m3/normal.log" in console

    # rebuilding the input set makes the run job out of date, and the shape is whole again
    snakemake(wf, "-f", "results/inputs/normal/48x64x128/manifest.json")
    snakemake(wf, bad)
    assert [r["status"] for r in json.loads((wf / bad).read_text())["rows"]] == ["ok"]


@pytest.mark.workflow
def test_an_unreadable_manifest_or_pickle_is_named(tiny_run_copy):
    wf = tiny_run_copy
    target = "results/cpu/fp8_e4m3/normal/48x64x128.json"
    manifest = wf / "results/inputs/normal/48x64x128/manifest.json"
    manifest.write_text(manifest.read_text()[:40])
    snakemake(wf, target)  # the manifest changed: the run job is out of date
    (row,) = json.loads((wf / target).read_text())["rows"]
    assert row["status"] == "failed" and "manifest.json: truncated JSON" in row["reason"]

    snakemake(wf, "-f", "results/inputs/normal/48x64x128/manifest.json")
    fp32 = wf / "results/inputs/normal/48x64x128/fp32.pt"
    fp32.write_bytes(fp32.read_bytes()[:-100])  # truncated
    snakemake(wf, target)
    (row,) = json.loads((wf / target).read_text())["rows"]
    assert row["status"] == "failed" and "fp32.pt" in row["reason"] and "weights_only" not in row["reason"]


@pytest.mark.workflow
def test_a_truncated_result_becomes_a_named_failed_row_and_the_report_is_rebuilt(tiny_run_copy):
    wf = tiny_run_copy
    outputs = ("results/cpu/tidy.csv", "results/cpu/report.html")
    result = wf / "results/cpu/cublas_bf16/normal/48x64x128.json"
    result.write_text(result.read_text()[:100])
    report_before = (wf / "results/cpu/report.html").stat().st_mtime_ns
    proc = snakemake(wf, *outputs)
    tidy = pd.read_csv(wf / "results/cpu/tidy.csv")
    bad = tidy[(tidy["shape"] == "48x64x128") & (tidy["variant"] == "cublas_bf16")]
    assert len(bad) == 1 and bad["status"].iloc[0] == "failed"
    reason = bad["reason"].iloc[0]
    assert "results/cpu/cublas_bf16/normal/48x64x128.json: truncated JSON" in reason
    assert "snakemake --cores 1 -f results/cpu/cublas_bf16/normal/48x64x128.json" in reason
    assert bad["variant"].iloc[0] == "cublas_bf16" and bad["platform"].iloc[0] == "cpu"
    assert (tidy[tidy["shape"] == "64x128x128"]["status"] == "ok").all()  # the other points are kept
    assert (tidy[tidy["variant"] != "cublas_bf16"]["status"] == "ok").all()
    assert (wf / "results/cpu/report.html").stat().st_mtime_ns != report_before
    assert "48x64x128.json: truncated JSON" in (wf / "results/cpu/report.html").read_text()
    assert "failed row(s)" in proc.stdout + proc.stderr


@pytest.mark.workflow
@pytest.mark.parametrize("target", ["results/cpu/fp8_e4m3/normal/0x64x128.json",
                                    "results/inputs/normal/0x64x128/manifest.json",
                                    "results/inputs/normal/064x128x128/manifest.json"])
def test_a_non_canonical_shape_target_matches_no_rule(tiny_workflow, target):
    proc = snakemake(tiny_workflow, "-n", target, check=False)
    assert proc.returncode != 0 and f"No rule to produce {target}" in proc.stdout + proc.stderr


@pytest.mark.workflow
def test_an_empty_mapping_in_an_override_is_refused_and_null_drops_a_variant(tiny_workflow):
    wf = tiny_workflow
    (wf / "empty.yaml").write_text("variants: {}\n")
    proc = snakemake(wf, "-n", "--configfile", "empty.yaml", check=False)
    assert proc.returncode != 0 and "variants: an empty mapping in an override" in proc.stdout + proc.stderr
    (wf / "drop.yaml").write_text("variants: {fp8_e4m3: null}\n")
    plan = snakemake(wf, "-n", "--configfile", "drop.yaml").stdout
    assert "emulate_cublas_bf16" in plan and "emulate_fp8_e4m3" not in plan and "results/cpu/fp8_e4m3" not in plan


def test_a_target_the_nvcc_on_the_path_lacks_is_refused(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvcc").write_text("#!/bin/sh\necho sm_80 sm_86\n")  # an older nvcc: no sm_90
    (fake / "nvcc").chmod(0o755)
    on_path(monkeypatch, fake)
    with pytest.raises(ConfigError, match=f"targets.0: sm_90a is not an arch of {fake}/nvcc"):
        Plan(validate(tiny_config()))


def test_git_tracks_no_generated_files():
    proc = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip("not a git checkout")
    generated = [f for f in proc.stdout.splitlines()
                 if ".egg-info/" in f or "__pycache__/" in f or f.startswith((".snakemake/", ".cache/", ".venv/"))
                 or (f.startswith("results/") and not f.startswith("results/published/"))]
    assert not generated, generated
