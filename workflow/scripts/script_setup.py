"""Shared start of every workflow script: import path and log redirection."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
from pathlib import Path


def setup(snakemake) -> Path:
    """Put the repo on sys.path, send stdout/stderr (including C++ logs) to the rule's log; return repo root."""
    repo = Path(snakemake.scriptdir).resolve().parents[1]
    sys.path.insert(0, str(repo))
    # a project-local kernel cache (read by TileLang at import): warm reruns load instead of compiling
    os.environ["TILELANG_CACHE_DIR"] = str(repo / snakemake.config.get("tilelang_cache", ".cache/tilelang"))
    if snakemake.log:
        log = Path(str(snakemake.log[0]))
        log.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    return repo


@contextlib.contextmanager
def gpu_lock():
    """Hold an exclusive, node-local lock while using the GPU: no two GPU jobs of this pipeline overlap on
    one node, whoever scheduled them (two snakemake invocations, a local run beside a cluster job). It
    lives on the node (/tmp, or LPGEMM_GPU_LOCK), never on a shared filesystem, where a lock would
    serialise every node or protect nothing."""
    lock = Path(os.environ.get("LPGEMM_GPU_LOCK", "/tmp/lpgemm-gpu.lock"))
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_json(path, obj) -> None:
    """Write atomically, so an interrupted job never leaves a half-written result behind."""
    path = Path(str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)
