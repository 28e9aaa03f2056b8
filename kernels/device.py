"""What hardware is present, and the environment tags every result row carries."""
from __future__ import annotations

import os
import re
import shutil
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


def platform_slug(gpu_name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA GeForce RTX 4090' -> 'rtx4090'."""
    words = [w for w in re.split(r"[\s_-]+", gpu_name.lower()) if w not in {"nvidia", "geforce", "tesla"}]
    slug = re.sub(r"[^a-z0-9]", "", "".join(words[:2]) if words[:1] in (["rtx"], ["gtx"]) else (words[0] if words else ""))
    return slug or "gpu"


def detect_gpu() -> dict | None:
    """The first GPU as seen by nvidia-smi (no torch import: cheap enough for workflow parsing)."""
    rows = _nvidia_smi("name,compute_cap")
    if not rows:
        return None
    name, cc = [x.strip() for x in rows[0].split(",")]
    major, minor = (int(x) for x in cc.split("."))
    return {
        "gpu_name": name,
        "compute_capability": f"{major}.{minor}",
        "arch": ARCH_OF_CC.get((major, minor), f"sm_{major}{minor}"),
        "platform": platform_slug(name),
    }


def check_platform(expected_platform: str, expected_arch: str | None) -> dict | None:
    """Confirm with torch that the host is what the workflow planned for; a mismatch is an error."""
    import torch

    if expected_platform == "cpu":
        return None
    if not torch.cuda.is_available():
        raise RuntimeError(f"platform {expected_platform!r} was planned but torch sees no CUDA GPU on this host")
    major, minor = torch.cuda.get_device_capability()
    name = torch.cuda.get_device_name()
    arch = ARCH_OF_CC.get((major, minor), f"sm_{major}{minor}")
    if platform_slug(name) != expected_platform or (expected_arch and arch != expected_arch):
        raise RuntimeError(
            f"GPU mismatch: planned {expected_platform}/{expected_arch}, found {name!r} ({arch}); rerun snakemake on this host"
        )
    return {"gpu_name": name, "arch": arch}


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
        "gpu_name": "none",
        "driver": "none",
        "sm_clock_mhz": None,
    }
    rows = _nvidia_smi("name,driver_version,clocks.sm")
    if rows:
        name, driver, clock = [x.strip() for x in rows[0].split(",")]
        tags |= {"gpu_name": name, "driver": driver, "sm_clock_mhz": float(clock) if clock.replace(".", "").isdigit() else None}
    return tags
