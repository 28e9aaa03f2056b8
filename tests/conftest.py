import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from slurm_cluster import slurm_cluster  # noqa: F401  (one session-wide cluster for every SLURM test)

REPO = Path(__file__).resolve().parents[1]


def copy_workflow(dest: Path, config: dict) -> Path:
    """A throwaway copy of the workflow with its own config.yaml (a --configfile would merge, not replace)."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in ("Snakefile", "workflow", "kernels", "harness", "envs", "profiles", "results/published"):
        src = REPO / item
        (shutil.copytree(src, dest / item, ignore=shutil.ignore_patterns("__pycache__", "report.html", "figures"))
         if src.is_dir() else shutil.copy(src, dest / item))
    (dest / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(workdir))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", *args], cwd=workdir,
                          capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def tiny_config() -> dict:
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["run_on"] = ["cpu"]
    cfg["distributions"] = ["normal"]
    cfg["targets"] = ["sm_90a"]
    cfg["sweeps"] = {"cpu": ["64x128x128", "48x64x128"], "gpu": ["64x128x128"], "cpu_compile": ["64x128x128"]}
    keep = {"fp8_e4m3", "cublas_bf16"}
    cfg["variants"] = {k: v for k, v in cfg["variants"].items() if k in keep}
    cfg["variants"]["fp8_e4m3"]["tiles"] = {"default": ["m64n64k64_s2_t128"]}
    return cfg


@pytest.fixture
def tiny_workflow(tmp_path):
    return copy_workflow(tmp_path, tiny_config())
