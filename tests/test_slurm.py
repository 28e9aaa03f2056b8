"""The pipeline through Snakemake's SLURM executor plugin, on a throwaway one-host cluster
(.ci/slurm-cluster: partitions cpu, h100, b200; fake GPUs and a fake nvidia-smi per node), and that
cluster itself. One file, so that pytest-xdist (--dist loadfile) runs every test that uses the cluster,
which is one per host, on one worker."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, copy_workflow, tiny_config

# the test cluster has no job accounting (sacct fails), its nodes 4 GB: small requests, squeue for status
SLURM_ARGS = ["--profile", "profiles/slurm", "--slurm-status-command", "squeue",
              "--slurm-init-seconds-before-status-checks", "2", "--latency-wait", "5", "--jobs", "6",
              "--default-resources", "slurm_partition=cpu", "runtime=10", "mem_mb=500"]


class SlurmRun:
    """snakemake through the SLURM plugin, started in the background (the two pipeline runs below share the
    cluster at once: each waits on the scheduler most of its time); ``result`` waits for it, bounded, since a
    lost status query would otherwise hang it."""

    def __init__(self, cluster, workdir: Path, *args: str, timeout: float):
        env = dict(cluster.env, PYTHONPATH=str(workdir))
        env.pop("LPGEMM_AUTO_PLATFORM", None)
        self.workdir, self.timeout, self.cluster = workdir, timeout, cluster
        self.proc = subprocess.Popen([sys.executable, "-m", "snakemake", *SLURM_ARGS, *args], cwd=workdir, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result(self) -> tuple[subprocess.Popen, str, str, list[dict]]:
        """The process, its stdout and stderr, and the cluster jobs it submitted (those of its folder)."""
        try:
            out, err = self.proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            pytest.fail(f"snakemake via SLURM did not finish in {self.timeout} s:\n{out[-3000:]}\n{err[-3000:]}")
        return self.proc, out, err, [j for j in slurm_jobs(self.cluster) if j["workdir"] == str(self.workdir)]


def slurm_jobs(cluster):
    """Every job the cluster still knows (MinJobAge keeps finished ones), as scontrol reports it: the
    submission's partition, GPU request (TresPerJob), node, comment (the plugin writes the rule there) and
    the folder it was submitted from."""
    out = cluster.run(["scontrol", "-o", "show", "job"], timeout=30).stdout
    jobs = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in out.splitlines() if line.startswith("JobId=")]
    return [{"id": j["JobId"], "partition": j.get("Partition"), "gpus": j.get("TresPerJob", ""),
             "node": j.get("NodeList"), "comment": j.get("Comment", ""), "start": j.get("StartTime"),
             "end": j.get("EndTime"), "workdir": j.get("WorkDir")} for j in jobs]


def gpu_config(**cluster_of):
    """A tiny config whose GPU sweep is one small shape, with the test cluster's GPU platforms."""
    cfg = tiny_config()
    cfg["sweeps"]["gpu"] = ["64x128x128"]
    cfg["targets"] = ["sm_90a", "sm_100a"]
    cfg["variants"] = {k: v for k, v in cfg["variants"].items() if k == "cublas_bf16"}
    cfg["run_on"] = list(cluster_of)
    for slug, (partition, model) in cluster_of.items():
        cfg["platforms"][slug]["cluster"] = {"partition": partition, "gpu_model": model, "runtime": 5, "mem_mb": 500}
    return cfg


@pytest.fixture(scope="module")
def pipeline_runs(slurm_cluster_session, tmp_path_factory):
    """Both pipeline runs on the cluster, started together by the first test that needs one: the tiny CPU
    pipeline (tests/conftest.py: tiny_config) and three GPU platforms planned from this GPU-less host, h200
    sent to the b200 partition by a wrong cluster entry."""
    root = tmp_path_factory.mktemp("slurm-runs")
    cpu = copy_workflow(root / "cpu", tiny_config())
    gpu = copy_workflow(root / "gpu", gpu_config(h100=("h100", "h100"), b200=("b200", "b200"), h200=("b200", "b200")))
    return {"cpu": SlurmRun(slurm_cluster_session, cpu, timeout=1200),
            "gpu": SlurmRun(slurm_cluster_session, gpu, "--keep-going", timeout=900)}


@pytest.mark.slurm
@pytest.mark.workflow
def test_the_tiny_cpu_pipeline_through_slurm_gives_the_local_tidy_table(slurm_cluster, pipeline_runs, tiny_run):
    """The session's tiny CPU run (tests/conftest.py), again through SLURM, in a copy of the same workflow and config."""
    proc, out, err, jobs = pipeline_runs["cpu"].result()
    assert proc.returncode == 0, out[-3000:] + err[-5000:]
    ran_on = {j["node"] for j in jobs}
    assert ran_on and ran_on <= {"cpu1", "cpu2"}, ran_on  # CPU jobs only, on the CPU partition
    # compiles and emulations went several to a submission (the profile's group-components); the plugin's
    # comment is rule_<group>_ followed by the group's rules
    for group, rule in (("cpu_compile", "compile"), ("cpu_emulate", "emulate")):
        batches = [j["comment"].removeprefix(f"rule_{group}") for j in jobs if j["comment"].startswith(f"rule_{group}_")]
        assert batches and max(b.count(f"_{rule}_") for b in batches) >= 2, (group, [j["comment"] for j in jobs])
    volatile = ["date", "node"]
    remote = pipeline_runs["cpu"].workdir
    local, cluster = (pd.read_csv(w / "results/cpu/tidy.csv").drop(columns=volatile) for w in (tiny_run, remote))
    # every planned row: three entries (two of them compiled kernels) at two shapes, all emulated on the CPU
    assert len(local) == 6 and set(local["target"]) == {"cpu"} and (local["status"] == "ok").all()
    pd.testing.assert_frame_equal(local, cluster, check_exact=False, rtol=1e-9)


@pytest.mark.slurm
@pytest.mark.workflow
def test_gpu_platforms_are_planned_on_a_gpu_less_host_and_sent_to_their_partitions(slurm_cluster, pipeline_runs):
    """One run of three GPU platforms: h100 and b200 to their own partitions, and h200 sent to the b200
    partition by a wrong cluster entry, whose jobs must fail naming the config keys to fix."""
    proc, _, _, jobs = pipeline_runs["gpu"].result()
    wf = pipeline_runs["gpu"].workdir
    # the GPUs are fake: each GPU job lands, checks its GPU, then finds no CUDA device (or the wrong GPU) and fails
    assert proc.returncode != 0
    gpu_jobs = [j for j in jobs if j["partition"] in ("h100", "b200")]
    # each platform's run and ceilings jobs, in allocations of its group gpu_<platform>, on the partition its
    # cluster entry names
    assert {(j["partition"], j["comment"]) for j in gpu_jobs} == {
        (partition, f"rule_gpu_{p}_{r}") for p, partition in (("h100", "h100"), ("b200", "b200"), ("h200", "b200"))
        for r in ("run_cublas_bf16", "measure_ceilings")}, jobs
    for job in gpu_jobs:
        partition = job["partition"]
        assert job["gpus"] == f"gres:gpu:{partition}:1" and job["node"] == f"{partition}n1", job
    assert {j["partition"] for j in jobs if j not in gpu_jobs} == {"cpu"}, jobs
    # different platforms run at the same time: h100's run allocation overlaps that of another platform on
    # b200n1 (b200's and h200's take turns there, one GPU)
    runs = [j for j in gpu_jobs if "_run_" in j["comment"]]
    h100 = next(j for j in runs if j["partition"] == "h100")
    assert any(max(h100["start"], j["start"]) <= min(h100["end"], j["end"]) for j in runs if j["node"] == "b200n1"), runs
    for platform in ("h100", "b200"):
        log = (wf / f"results/logs/{platform}/cublas_bf16/normal.log").read_text()
        assert f"node {platform}n1 has" in log and f"matches platforms.{platform}.match" in log, log
        assert "torch sees no CUDA device" in log, log  # the fake GPU ends it there
    # h200's jobs landed on a B200: the run fails naming the keys that decide where a job goes
    log = (wf / "results/logs/h200/cublas_bf16/normal.log").read_text()
    assert "GPU mismatch" in log and "node b200n1 has 'NVIDIA B200'" in log, log
    assert "platforms.h200.cluster" in log and "platforms.h200.match" in log, log
    assert not (wf / "results/h200/cublas_bf16/normal/64x128x128.json").exists()


def test_the_slurm_profile_batches_every_group_the_rules_name():
    profile = yaml.safe_load((REPO / "profiles/slurm/config.yaml").read_text())
    groups = {g.split("=")[0] for g in profile["group-components"]}
    platforms = yaml.safe_load((REPO / "config.yaml").read_text())["platforms"]
    # every group a rule names (gpu_{platform} once per catalogue platform), and no other
    named = {m for f in (REPO / "workflow/rules").glob("*.smk")
             for m in re.findall(r'^\s+group:\s*\n\s+"([^"]+)"', f.read_text(), re.M)}
    assert {"gpu_{platform}", "cpu_compile", "cpu_emulate"} <= named, named
    assert groups == {g for n in named for g in ([n.format(platform=p) for p in platforms] if "{" in n else [n])}
    assert "gpu=local" in profile["set-resource-scopes"] and "gpu=1" in profile["resources"]


# ---- the test cluster itself: fake GPUs per partition, visible to an srun step like the Snakemake plugin's

# Like snakemake-executor-plugin-slurm-jobstep 0.6.1: drop SLURM_* except the allocation identity, then srun.
# (Dropping SLURM_JOB_ID too would make srun create a new job in the default partition, i.e. on a cpu node.)
JOB = """#!/bin/bash
for v in $(env | grep -o '^SLURM_[A-Z_]*'); do
  case $v in SLURM_JOB_ID|SLURM_JOBID|SLURM_CLUSTER_NAME|SLURM_SUBMIT_DIR|SLURM_SUBMIT_HOST) ;; *) unset "$v" ;; esac
done
srun -n1 nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader,nounits
echo "rc=$?"
"""


def sbatch(cluster, tmp_path, *args):
    script, out = tmp_path / "job.sh", tmp_path / "job.out"
    script.write_text(JOB)
    proc = cluster.run(["sbatch", "--wait", "-t", "1", "-o", str(out), *args, str(script)], timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return out.read_text()


@pytest.mark.slurm
@pytest.mark.parametrize("gpu, name, cc", [("h100", "NVIDIA H100 80GB HBM3", "9.0"), ("b200", "NVIDIA B200", "10.0")])
def test_gpu_partition_sees_its_gpu(slurm_cluster, tmp_path, gpu, name, cc):
    out = sbatch(slurm_cluster, tmp_path, "-p", gpu, f"--gpus={gpu}:1")
    assert f"{name}, {cc}\nrc=0" in out, out


@pytest.mark.slurm
def test_cpu_partition_has_no_gpu(slurm_cluster, tmp_path):
    out = sbatch(slurm_cluster, tmp_path, "-p", "cpu")
    assert "couldn't communicate with the NVIDIA driver" in out and "rc=9" in out, out


if os.environ.get("LPGEMM_AUTO_PLATFORM"):  # a stale resolution would leak into every test run
    raise RuntimeError("LPGEMM_AUTO_PLATFORM is set in the test environment")
