"""Faults and bad input (issue 11): a corrupt file is detected and named, one bad shape keeps the others'
results, every failure is listed on the console with its log, and a valid config never crashes a job."""
import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, copy_workflow, snakemake, tiny_config

pytestmark = pytest.mark.workflow


def flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def emulation_only(tmp_path, variants=("fp8_e4m3",)):
    cfg = tiny_config()
    cfg["variants"] = {k: v for k, v in cfg["variants"].items() if k in variants}
    return copy_workflow(tmp_path, cfg)


def test_a_corrupt_input_fails_its_shape_only_and_is_named(tmp_path):
    wf = emulation_only(tmp_path)
    good, bad = (f"results/cpu/fp8_e4m3/normal/{s}.json" for s in ("64x128x128", "48x64x128"))
    snakemake(wf, good, bad)
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
    assert str(corrupt.relative_to(wf)) in row["reason"] and "snakemake -f" in row["reason"]
    # the end of the run lists the failure and the log holding its traceback
    console = proc.stdout + proc.stderr
    assert "1 failed row(s)" in console and bad in console
    assert "log: results/logs/cpu/fp8_e4m3/normal.log" in console

    # rebuilding the input set makes the run job out of date, and the shape is whole again
    snakemake(wf, "-f", "results/inputs/normal/48x64x128/manifest.json")
    snakemake(wf, bad)
    assert [r["status"] for r in json.loads((wf / bad).read_text())["rows"]] == ["ok"]


def test_an_unreadable_manifest_or_pickle_is_named(tmp_path):
    wf = emulation_only(tmp_path)
    target = "results/cpu/fp8_e4m3/normal/48x64x128.json"
    snakemake(wf, target)
    manifest = wf / "results/inputs/normal/48x64x128/manifest.json"
    manifest.write_text(manifest.read_text()[:40])
    snakemake(wf, target)  # the manifest changed: the run job is out of date
    (row,) = json.loads((wf / target).read_text())["rows"]
    assert row["status"] == "failed" and "manifest.json: unreadable manifest" in row["reason"]

    snakemake(wf, "-f", "results/inputs/normal/48x64x128/manifest.json")
    fp32 = wf / "results/inputs/normal/48x64x128/fp32.pt"
    fp32.write_bytes(fp32.read_bytes()[:-100])  # truncated
    snakemake(wf, target)
    (row,) = json.loads((wf / target).read_text())["rows"]
    assert row["status"] == "failed" and "fp32.pt" in row["reason"] and "weights_only" not in row["reason"]


def test_a_truncated_result_becomes_a_named_failed_row_and_the_report_is_rebuilt(tmp_path):
    wf = emulation_only(tmp_path, variants=("cublas_bf16",))
    outputs = ("results/cpu/tidy.csv", "results/cpu/report.html")
    snakemake(wf, *outputs)
    result = wf / "results/cpu/cublas_bf16/normal/48x64x128.json"
    result.write_text(result.read_text()[:100])
    report_before = (wf / "results/cpu/report.html").stat().st_mtime_ns
    proc = snakemake(wf, *outputs)
    tidy = pd.read_csv(wf / "results/cpu/tidy.csv")
    bad = tidy[tidy["shape"] == "48x64x128"]
    assert len(bad) == 1 and bad["status"].iloc[0] == "failed"
    reason = bad["reason"].iloc[0]
    assert "results/cpu/cublas_bf16/normal/48x64x128.json: unreadable result (JSONDecodeError" in reason
    assert "snakemake -f" in reason
    assert bad["variant"].iloc[0] == "cublas_bf16" and bad["platform"].iloc[0] == "cpu"
    assert (tidy[tidy["shape"] == "64x128x128"]["status"] == "ok").all()  # the other point is kept
    assert (wf / "results/cpu/report.html").stat().st_mtime_ns != report_before
    assert "48x64x128.json: unreadable result" in (wf / "results/cpu/report.html").read_text()
    assert "failed row(s)" in proc.stdout + proc.stderr


def test_a_variant_with_no_buildable_target_records_unsupported(tmp_path):
    # blockscaled_sm100 builds only for sm_100a; without it every record is unsupported, and the job
    # (whose artifacts folder then holds no kernel) must still succeed
    cfg = tiny_config() | {"targets": ["sm_89", "sm_90a"]}
    full = yaml.safe_load((REPO / "config.yaml").read_text())["variants"]["blockscaled_sm100"]
    cfg["variants"] = {"blockscaled_sm100": {"tiles": full["tiles"], "tolerance": full["tolerance"]}}
    wf = copy_workflow(tmp_path, cfg)
    snakemake(wf, "--until", "compile_blockscaled_sm100")
    for target in ("sm_89", "sm_90a"):
        (rec,) = json.loads((wf / f"results/compile/blockscaled_sm100/{target}/m128n128k128_s1_t128.json")
                            .read_text())["records"]
        assert rec["status"] == "unsupported" and "sm_100" in rec["reason"]


@pytest.mark.parametrize("target", ["results/cpu/fp8_e4m3/normal/0x64x128.json",
                                    "results/inputs/normal/0x64x128/manifest.json",
                                    "results/inputs/normal/064x128x128/manifest.json"])
def test_a_non_canonical_shape_target_matches_no_rule(tmp_path, target):
    proc = snakemake(emulation_only(tmp_path), "-n", target, check=False)
    assert proc.returncode != 0 and f"No rule to produce {target}" in proc.stdout + proc.stderr


def test_an_empty_mapping_in_an_override_is_refused_and_null_drops_a_variant(tmp_path):
    wf = emulation_only(tmp_path, variants=("fp8_e4m3", "cublas_bf16"))
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
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    proc = snakemake(emulation_only(tmp_path / "wf"), "-n", check=False)
    assert proc.returncode != 0 and f"targets.0: sm_90a is not an arch of {fake}/nvcc" in proc.stdout + proc.stderr


def test_git_tracks_no_generated_files():
    proc = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip("not a git checkout")
    generated = [f for f in proc.stdout.splitlines()
                 if ".egg-info/" in f or "__pycache__/" in f or f.startswith((".snakemake/", ".cache/", ".venv/"))
                 or (f.startswith("results/") and not f.startswith("results/published/"))]
    assert not generated, generated
