"""The local SLURM test cluster: fake GPUs per partition, visible to an srun step like the Snakemake plugin's."""

import pytest

pytestmark = pytest.mark.slurm

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


@pytest.mark.parametrize("gpu, name, cc", [("h100", "NVIDIA H100 80GB HBM3", "9.0"), ("b200", "NVIDIA B200", "10.0")])
def test_gpu_partition_sees_its_gpu(slurm_cluster, tmp_path, gpu, name, cc):
    out = sbatch(slurm_cluster, tmp_path, "-p", gpu, f"--gpus={gpu}:1")
    assert f"{name}, {cc}\nrc=0" in out, out


def test_cpu_partition_has_no_gpu(slurm_cluster, tmp_path):
    out = sbatch(slurm_cluster, tmp_path, "-p", "cpu")
    assert "couldn't communicate with the NVIDIA driver" in out and "rc=9" in out, out
