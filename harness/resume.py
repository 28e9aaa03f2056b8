"""Runs that outlive their machine: a finished run job is known by its records, not by timestamps.

A run job (a variant's sweep for one platform and distribution) writes one record per shape, each whole
(harness/atomic.py), each stamped with the job's *key*: a hash of everything that decides what the job
measures (its resolved params: shapes, tiles, tolerances, timing, peers; the content of every code file it
reaches; the input seed; the versions of TileLang and torch). When planning finds every record of a job
present, readable, stamped with the key the job has now and not marked incomplete by snakemake, the job is
*finished*: its rule then asks for nothing upstream (``workflow/rules/common.smk``: ``run_inputs``), so
neither a newer input, a fresh checkout's file times, missing ``.snakemake`` metadata, nor a missing input
file (never built on this host) makes snakemake run it again. Any change of what it would measure changes
the key, and the job runs again as before.

So a GPU run stopped at any point (an interrupt, a time limit, the machine taken away) continues on
another host of the same platform given the finished ``results/<platform>/`` folder: snakemake repeats
none of its finished jobs (docs/operations.md: Continue a stopped run).
"""
from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

from harness.inputs import changed_since_hashed
from harness.records import RUN, DamagedFile, read_json

# the snakemake options this needs off: `input` (the set of input files changed) and `code` (the script
# newer than the outputs, which a fresh checkout always is) would rerun a finished job, which then lacks
# its inputs; its key covers both (the code files' content is in it). profiles/*/config.yaml set them.
CONFLICTING_TRIGGERS = ("input", "code")


@functools.lru_cache(maxsize=None)
def _file_sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _versions() -> dict:
    found = {}
    for dist in ("tilelang", "torch"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    return found


# code that starts a job's process, watches it and writes its files whole, and decides nothing it measures:
# left out of the key, so that a fix to how jobs start does not throw away hours of finished measurements
JOB_LIFE = ("harness/jobs.py", "harness/warm.py", "harness/atomic.py", "workflow/scripts/checkout_first.py")


def job_key(params: Mapping, code: Iterable[str], **identity) -> str:
    """The key of a run job: its resolved params, its code files' content (but JOB_LIFE's), and ``identity``
    (seed, ...)."""
    measured = sorted(f for f in map(str, code) if not f.endswith(JOB_LIFE))
    blob = {"params": params, "code": {f: _file_sha256(f) for f in measured},
            "identity": identity, "versions": _versions()}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:32]


def incomplete_outputs(snakemake_dir: str | os.PathLike = ".snakemake") -> set[str]:
    """The output paths snakemake marks incomplete (a job of them started and did not finish)."""
    root = Path(snakemake_dir) / "incomplete"
    found = set()
    if not root.is_dir():
        return found
    for folder, _, files in os.walk(root):
        for name in files:
            parts = Path(folder, name).relative_to(root).parts
            if name == "migration_underway":
                continue
            encoded = "".join(p.removeprefix("@") for p in parts)
            try:
                found.add(os.path.normpath(base64.urlsafe_b64decode(encoded).decode()))
            except (ValueError, UnicodeDecodeError):
                continue
    return found


class Inputs(NamedTuple):
    """One record's inputs: its shape's manifest, the format it reads, and its data files."""

    manifest: str
    fmt: str
    files: tuple[str, ...]


def inputs_still_measured(record: dict, inputs: Inputs) -> bool:
    """Whether the inputs present on this host are still those the record measured: their manifest names the
    tensors the record's ``input_sha256`` names, and no data file changed since this host hashed it
    (harness/inputs.py keeps that hash on the file). Inputs this host has not built (a fresh host) cannot
    contradict the record."""
    if Path(inputs.manifest).exists():
        try:
            manifest = read_json(inputs.manifest)
            tensors = manifest["formats"][inputs.fmt]["tensors"]
            if {k: v["sha256"] for k, v in tensors.items()} != record["point"].get("input_sha256"):
                return False
        except (DamagedFile, KeyError, TypeError, AttributeError):
            return False
    return not any(changed_since_hashed(f) for f in inputs.files)


def finished(outputs: Iterable[str], key: str, incomplete: set[str], inputs: Iterable[Inputs] | None = None) -> bool:
    """Whether every one of a job's records is there, whole, stamped with ``key``, not incomplete, and (with
    ``inputs``, one per output) not contradicted by the inputs this host holds."""
    outputs = list(outputs)
    inputs = [None] * len(outputs) if inputs is None else list(inputs)
    for out, ins in zip(outputs, inputs, strict=True):
        if os.path.normpath(out) in incomplete:
            return False
        try:
            record = read_json(out, RUN)
        except DamagedFile:
            return False
        if record["point"].get("job_key") != key or (ins is not None and not inputs_still_measured(record, ins)):
            return False
    return True
