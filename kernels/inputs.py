"""Deterministic input matrices and their storage with content hashes."""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from kernels.registry import Operands


def _generator(seed: int, *key: object) -> torch.Generator:
    # a stable per-(dist, shape, operand) seed: Python's hash() is salted per process
    digest = hashlib.sha256(repr((seed, *key)).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


def _normal(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(rows, cols, generator=gen, dtype=torch.float32)


def _student_t3(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    # Student's t with 3 degrees of freedom: Z / sqrt(chi2_3 / 3); heavy tails stress per-tensor scales
    z = torch.randn(rows, cols, generator=gen, dtype=torch.float32)
    chi2 = sum(torch.randn(rows, cols, generator=gen, dtype=torch.float32) ** 2 for _ in range(3))
    return z / torch.sqrt(chi2 / 3)


DISTRIBUTIONS = {"normal": _normal, "student_t3": _student_t3}


def make_matrix(dist: str, rows: int, cols: int, seed: int, name: str) -> torch.Tensor:
    """A (rows, cols) float32 matrix drawn from ``dist``, a pure function of its arguments."""
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {dist!r}; known: {', '.join(DISTRIBUTIONS)}")
    return DISTRIBUTIONS[dist](rows, cols, _generator(seed, dist, rows, cols, name))


def make_operands(dist: str, M: int, N: int, K: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Unquantized A (M,K) and B (N,K); B does not depend on M, so one weight serves many M."""
    return make_matrix(dist, M, K, seed, f"A{M}"), make_matrix(dist, N, K, seed, "B")


def tensor_sha256(t: torch.Tensor) -> str:
    data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()


def manifest(ops: Operands) -> dict:
    return {k: {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch."), "sha256": tensor_sha256(v)}
            for k, v in ops.items()}


def save_operands(ops: Operands, path: Path) -> dict:
    """Write tensors to ``path`` (torch.save); returns the manifest of shapes, dtypes and sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.contiguous() for k, v in ops.items()}, path)
    return manifest(ops)


def load_operands(path: Path, expected: dict | None = None) -> Operands:
    """Load tensors; with ``expected`` (a manifest) verify every hash so a run proves its inputs."""
    ops = torch.load(path, weights_only=True)
    if expected is not None:
        got = manifest(ops)
        bad = [k for k in expected if got.get(k, {}).get("sha256") != expected[k]["sha256"]]
        if bad:
            raise ValueError(f"{path}: tensors {bad} do not match their recorded sha256; rebuild the inputs")
    return ops
