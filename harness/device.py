"""What hardware is present, and the environment tags every result row carries."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

# compute capability -> the TileLang/nvcc arch a kernel must be built for to run there
ARCH_OF_CC = {(8, 0): "sm_80", (8, 6): "sm_86", (8, 9): "sm_89", (9, 0): "sm_90a", (10, 0): "sm_100a", (12, 0): "sm_120"}


def _nvidia_smi(query: str) -> list[str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def arch_of(major: int, minor: int) -> str:
    return ARCH_OF_CC.get((major, minor), f"sm_{major}{minor}")


def detect_gpu() -> dict | None:
    """The first GPU as seen by nvidia-smi (no torch import: cheap enough for workflow parsing)."""
    rows = _nvidia_smi("name,compute_cap")
    if not rows:
        return None
    name, cc = [x.strip() for x in rows[0].split(",")]
    major, minor = (int(x) for x in cc.split("."))
    return {"gpu_name": name, "compute_capability": f"{major}.{minor}",
            "arch": arch_of(major, minor)}


def matching_platforms(gpu_name: str, platforms: dict) -> list[str]:
    """The catalogue slugs (config ``platforms``) whose ``match`` pattern fits this GPU name."""
    return [slug for slug, spec in platforms.items() if re.search(spec["match"], gpu_name)]


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def check_landed(platform: str, spec: dict) -> dict:
    """A GPU job's first act: confirm that the node it landed on has its platform's GPU (nvidia-smi
    name against ``platforms.<platform>.match``, then torch's view of the device and its arch).
    A mismatch is an error naming the config keys that decide where the job goes."""
    node = node_name()
    where = (f"platforms.{platform}.cluster (partition, gpu_model, constraint) decides where its jobs are sent; "
             f"platforms.{platform}.match decides which GPU names count as {platform}")
    gpu = detect_gpu()
    if gpu is None:
        raise RuntimeError(f"GPU mismatch: this job is planned for platform {platform} ({spec['name']}), but node "
                           f"{node} has no GPU that nvidia-smi can see. {where}.")
    if not re.search(spec["match"], gpu["gpu_name"]):
        raise RuntimeError(f"GPU mismatch: this job is planned for platform {platform} ({spec['name']}, "
                           f"platforms.{platform}.match {spec['match']!r}), but node {node} has {gpu['gpu_name']!r}. "
                           f"{where}.")
    print(f"platform {platform}: node {node} has {gpu['gpu_name']!r}, which matches platforms.{platform}.match",
          flush=True)
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"platform {platform}: nvidia-smi on node {node} reports {gpu['gpu_name']!r}, "
                           "but torch sees no CUDA device (driver, CUDA_VISIBLE_DEVICES or a CPU build of torch)")
    name = torch.cuda.get_device_name()
    arch = arch_of(*torch.cuda.get_device_capability())
    if not re.search(spec["match"], name) or arch != spec["arch"]:
        raise RuntimeError(f"GPU mismatch: platform {platform} expects {spec['arch']} matching {spec['match']!r}; "
                           f"torch on node {node} sees {name!r} ({arch}). Check platforms.{platform}.arch and .match.")
    return {"gpu_name": name, "arch": arch, "node": node}


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "absent"


def git_commit(repo: Path | None = None) -> str:
    """HEAD (with -dirty), or LPGEMM_GIT_COMMIT where the tree was copied without its history."""
    if os.environ.get("LPGEMM_GIT_COMMIT"):
        return os.environ["LPGEMM_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                             cwd=repo, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=repo, timeout=10).stdout.strip()
        return (out.stdout.strip() + ("-dirty" if dirty else "")) if out.returncode == 0 else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def environment_tags() -> dict:
    """GPU, driver, CUDA, library versions, commit and the SM clock right now."""
    import torch

    tags = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "torch": torch.__version__,
        "tilelang": _version("tilelang"),
        "cuda": torch.version.cuda or "none",
        "git_commit": git_commit(),
        "node": node_name(),
        "gpu_name": "none",
        "driver": "none",
        "sm_clock_mhz": None,
    }
    rows = _nvidia_smi("name,driver_version,clocks.sm")
    if rows:
        name, driver, clock = [x.strip() for x in rows[0].split(",")]
        tags |= {"gpu_name": name, "driver": driver, "sm_clock_mhz": float(clock) if clock.replace(".", "").isdigit() else None}
    return tags
