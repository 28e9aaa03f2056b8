"""Runs that outlive their machine (harness/resume.py): a finished run job is known by the key its records
carry, so a run stopped at any point continues in a fresh checkout (other file times, no .snakemake
metadata, no inputs or compiled kernels) given its finished results/<platform>/, repeating no finished job."""
import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import copy_workflow, snakemake, tiny_config

from harness.resume import Inputs, finished, incomplete_outputs, job_key

# ---------------------------------------------------------------- the key and the finished check


def _record(path: Path, key: str, rows=({"tile": "emulated", "status": "ok"},), sha=None) -> Path:
    point = {"platform": "cpu", "target": "cpu", "variant": "fp8_e4m3", "entry": "fp8_e4m3", "family": "fp8",
             "dist": "normal", "shape": "64x64x64", "M": 64, "N": 64, "K": 64, "job_key": key,
             "input_sha256": {"A": "a", "B": "b"} if sha is None else sha}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"point": point, "env": {}, "rows": list(rows)}))
    return path


def test_job_key_follows_params_code_and_identity(tmp_path):
    code = tmp_path / "module.py"
    code.write_text("x = 1\n")
    params = {"shapes": ["64x64x64"], "tiles": {"64x64x64": ["m64n64k64_s2_t128"]}}
    key = job_key(params, [code], seed=1, dist="normal")
    assert key == job_key(dict(params), [str(code)], seed=1, dist="normal")  # a pure function
    assert key != job_key(params | {"shapes": ["64x64x128"]}, [code], seed=1, dist="normal")
    assert key != job_key(params, [code], seed=2, dist="normal")
    other = tmp_path / "other.py"
    other.write_text("x = 2\n")
    assert key != job_key(params, [other], seed=1, dist="normal")  # the content counts, not the name
    life = tmp_path / "harness" / "warm.py"
    life.parent.mkdir()
    life.write_text("how a job starts\n")
    assert job_key(params, [code, life], seed=1, dist="normal") == key  # not what it measures


def test_finished_needs_every_record_whole_with_the_key_and_not_incomplete(tmp_path):
    a, b = _record(tmp_path / "a.json", "k"), _record(tmp_path / "b.json", "k")
    outs = [str(a), str(b)]
    assert finished(outs, "k", set())
    assert not finished(outs, "other", set())  # made by other code, params or inputs
    assert not finished(outs, "k", {os.path.normpath(str(b))})  # snakemake saw its job stop
    b.write_text(b.read_text()[:-20])  # damaged
    assert not finished(outs, "k", set())
    b.unlink()
    assert not finished(outs, "k", set())


def test_finished_records_are_not_contradicted_by_the_inputs_this_host_holds(tmp_path):
    """A record stands where its inputs are absent (a fresh host); where they are here, their manifest must
    name the tensors the record measured, and no data file may have changed since this host hashed it."""
    from harness.inputs import remember_sha256

    out = _record(tmp_path / "r.json", "k", sha={"A": "a", "B": "b"})
    manifest, data = tmp_path / "in" / "manifest.json", tmp_path / "in" / "fmt.pt"
    ins = [Inputs(str(manifest), "fp8", (str(data),))]
    assert finished([str(out)], "k", set(), ins)  # nothing here to contradict it
    manifest.parent.mkdir()
    manifest.write_text(json.dumps({"formats": {"fp8": {"tensors": {"A": {"sha256": "a"}, "B": {"sha256": "b"}}}}}))
    data.write_bytes(b"12345678")
    remember_sha256(data, "whatever")  # as the input job does when it writes the file
    assert finished([str(out)], "k", set(), ins)
    later = data.stat().st_mtime_ns + 5_000_000_000
    os.utime(data, ns=(later, later))  # touched by snakemake when its job ended: not a change
    assert finished([str(out)], "k", set(), ins)
    data.write_bytes(b"12345679")  # changed in place since it was hashed here
    assert not finished([str(out)], "k", set(), ins)
    remember_sha256(data, "rebuilt")
    assert finished([str(out)], "k", set(), ins)
    manifest.write_text(json.dumps({"formats": {"fp8": {"tensors": {"A": {"sha256": "other"}, "B": {"sha256": "b"}}}}}))
    assert not finished([str(out)], "k", set(), ins)  # other inputs than the record measured
    manifest.write_text("{")
    assert not finished([str(out)], "k", set(), ins)  # unreadable: run it again, and it names the file
    empty = _record(tmp_path / "failed.json", "k", sha={})  # a shape whose inputs could not be read then
    manifest.write_text(json.dumps({"formats": {"fp8": {"tensors": {"A": {"sha256": "a"}, "B": {"sha256": "b"}}}}}))
    assert not finished([str(empty)], "k", set(), ins)  # readable now: try again


def test_incomplete_markers_are_read_as_snakemake_writes_them(tmp_path):
    """Snakemake names a marker by the urlsafe base64 of the output path, split into '@'-prefixed parts
    where longer than a file name may be."""
    root = tmp_path / ".snakemake" / "incomplete"
    short = "results/h200/fp8_e4m3/normal/64x64x64.json"
    long = "results/h200/" + "x" * 300 + ".json"
    (root).mkdir(parents=True)
    (root / base64.urlsafe_b64encode(short.encode()).decode()).write_text("{}")
    enc = base64.urlsafe_b64encode(long.encode()).decode()
    parts = [enc[i:i + 254] for i in range(0, len(enc), 254)]
    folder = root.joinpath(*["@" + p for p in parts[:-1]])
    folder.mkdir(parents=True)
    (folder / parts[-1]).write_text("{}")
    (root / "migration_underway").write_text("")
    assert incomplete_outputs(tmp_path / ".snakemake") == {short, long}
    assert incomplete_outputs(tmp_path / "nowhere") == set()


# ---------------------------------------------------------------- a run in sittings, on fresh checkouts


def _jobs_run(proc) -> dict[str, int]:
    """The 'Job stats' table of a snakemake run: rule -> jobs run."""
    lines = proc.stderr.splitlines() + proc.stdout.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip() == "Job stats:"), None)
    if start is None:
        return {}
    stats = {}
    for ln in lines[start + 3:]:
        parts = ln.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        stats[parts[0]] = int(parts[1])
    return stats


def _fresh_checkout(root: Path, cfg: dict, results_from: Path | None) -> Path:
    """A new checkout (new file times, no .snakemake, no inputs, no compiled kernels) given only the finished
    results/cpu of an earlier sitting, packed and unpacked as docs/operations.md says; then its records are
    made older than every input and code file (times must not matter)."""
    wf = copy_workflow(root, cfg)
    if results_from is not None:
        part = root.parent / f"{root.name}-part.tgz"
        subprocess.run(["tar", "czf", str(part), "results/cpu"], cwd=results_from, check=True)
        subprocess.run(["tar", "xzf", str(part)], cwd=wf, check=True)
        for rec in (wf / "results" / "cpu").rglob("*.json"):
            os.utime(rec, (1_000_000, 1_000_000))
    return wf


def _records(wf: Path) -> dict[str, bytes]:
    return {str(p.relative_to(wf)): p.read_bytes() for p in sorted((wf / "results" / "cpu").glob("*/*/*.json"))}


def _interrupt_when(wf: Path, marker: str, timeout: float = 300) -> None:
    """Start the whole run and interrupt snakemake (SIGINT, as a time limit does) once ``marker`` exists."""
    env = dict(os.environ, PYTHONPATH=str(wf))
    with open(wf.parent / f"{wf.name}-snakemake.log", "w+") as log:
        proc = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2"], cwd=wf, env=env,
                                stdout=log, stderr=subprocess.STDOUT)
        end = time.monotonic() + timeout
        while not (wf / marker).exists() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=120)
        log.seek(0)
        assert rc != 0, f"the run ended (status {rc}) before it could be interrupted:\n{log.read()[-4000:]}"


@pytest.mark.workflow
def test_a_run_stopped_three_times_continues_on_fresh_checkouts_and_repeats_no_finished_job(tmp_path, tiny_run):
    cfg = tiny_config()
    cfg["tilelang_cache"] = str(tmp_path / "tilelang-cache")  # shared by the sittings: compiles are not the point
    fp8 = [f"results/cpu/fp8_e4m3/normal/{s}.json" for s in cfg["sweeps"]["cpu"]]
    bf16 = [f"results/cpu/cublas_bf16/normal/{s}.json" for s in cfg["sweeps"]["cpu"]]

    # 1: stopped after one run job (only its records asked for)
    wf1 = _fresh_checkout(tmp_path / "wf1", cfg, None)
    snakemake(wf1, *fp8)
    first = _records(wf1)
    assert sorted(first) == sorted(fp8)

    # 2: a fresh checkout given sitting 1's records runs another job, and not the finished one
    wf2 = _fresh_checkout(tmp_path / "wf2", cfg, wf1)
    proc = snakemake(wf2, *fp8, *bf16)
    assert "emulate_fp8_e4m3" not in _jobs_run(proc) and _jobs_run(proc).get("emulate_cublas_bf16") == 1
    assert {k: v for k, v in _records(wf2).items() if k in first} == first  # untouched

    # 3: stopped by an interrupt while the inputs of the remaining job are built
    wf3 = _fresh_checkout(tmp_path / "wf3", cfg, wf2)
    _interrupt_when(wf3, "results/logs/inputs/normal")
    done = _records(wf3)
    assert {k: v for k, v in done.items() if k in first} == first

    # 4: a last fresh checkout finishes; the dry run beforehand lists only what is left
    wf4 = _fresh_checkout(tmp_path / "wf4", cfg, wf3)
    plan = _jobs_run(snakemake(wf4, "-n"))
    assert "emulate_fp8_e4m3" not in plan and "emulate_cublas_bf16" not in plan
    assert "build_inputs_baseline_fp8" in plan  # the unfinished job still needs its inputs
    proc = snakemake(wf4)
    ran = _jobs_run(proc)
    assert set(ran) & {"emulate_fp8_e4m3", "emulate_cublas_bf16"} == set() and ran.get("emulate_fp8_e5m2") == 1
    assert {k: v for k, v in _records(wf4).items() if k in first} == first
    # a later sitting on this checkout, whose inputs are built now (and touched by snakemake when their job
    # ended) but were never read by the jobs finished elsewhere, has nothing left to do
    assert _jobs_run(snakemake(wf4, "-n")) == {}

    # the table equals the one of a run made in one go (the session's tiny run)
    cols = ["entry", "dist", "shape", "tile", "status", "total_rel_fro", "kernel_rel_fro"]
    got = pd.read_csv(wf4 / "results/cpu/tidy.csv")[cols].sort_values(cols[:4]).reset_index(drop=True)
    want = pd.read_csv(tiny_run / "results/cpu/tidy.csv")[cols].sort_values(cols[:4]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want)

    # editing code the finished jobs reach makes them run again (their key changes)
    runner = wf4 / "harness" / "runner.py"
    runner.write_text(runner.read_text() + "\n# edited\n")
    plan = _jobs_run(snakemake(wf4, "-n"))
    assert plan.get("emulate_fp8_e4m3") == 1 and plan.get("emulate_cublas_bf16") == 1


@pytest.mark.workflow
def test_forcing_a_finished_job_runs_it_with_its_inputs(tiny_run_copy):
    plan = _jobs_run(snakemake(tiny_run_copy, "-n", "--forcerun", "emulate_fp8_e4m3"))
    assert plan.get("emulate_fp8_e4m3") == 1
    proc = snakemake(tiny_run_copy, "--forcerun", "emulate_fp8_e4m3")
    assert _jobs_run(proc).get("emulate_fp8_e4m3") == 1


@pytest.mark.workflow
def test_a_job_killed_mid_way_on_this_host_runs_again_without_a_flag(tiny_run_copy):
    """A SIGKILL (a time limit's second signal, a lost machine) leaves snakemake's incomplete marker on the
    job's outputs; the next `snakemake` on the same checkout runs that job again instead of refusing."""
    record = "results/cpu/fp8_e4m3/normal/" + tiny_config()["sweeps"]["cpu"][0] + ".json"
    marker = tiny_run_copy / ".snakemake" / "incomplete" / base64.urlsafe_b64encode(record.encode()).decode()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("{}")
    assert incomplete_outputs(tiny_run_copy / ".snakemake") == {record}
    plan = _jobs_run(snakemake(tiny_run_copy, "-n"))
    assert plan.get("emulate_fp8_e4m3") == 1 and "emulate_cublas_bf16" not in plan
