"""The generated CUDA of every configured tile, held by hash: a refactor of the kernels' Python must not move
one instruction of what they generate (then no published GPU number moves, and nothing is republished).

The hash is taken over the kernel source TileLang generates (``kernel.cu`` of the compile step) for every
(TileLang variant, target, tile) that config.yaml compiles at its compile-check shape, after renaming the
identifiers the source declares (buffers, locals, parameters) to ``v0, v1, …`` in order of first
appearance: TileLang derives them from Python variable names and de-duplicates them with counters
(``gi_1``, ``mb_2``), which a rename of a Python local changes without changing the kernel. Before
that, the pointers into dynamic shared memory are replaced by the sorted list of their offsets: where
two buffers share a Python name (one per branch), which of them TileLang calls ``A_s`` and places first
varies from one lowering to the next.

A change that is meant to change a kernel updates the table on purpose::

    LPGEMM_UPDATE_CUDA_HASHES=1 .venv/bin/python -m pytest tests/test_generated_cuda.py -m compile

and says in its commit why the kernels changed (and republishes what they measure).
"""
import hashlib
import json
import os
import re
from pathlib import Path

import pytest
from conftest import CANONICAL_SHAPE, DEFAULT_CONFIG, REPO

from harness.plan import Plan
from kernels.registry import load_all
from kernels.tiles import compile_check_shape, parse_shape, parse_tile

HASHES = Path(__file__).with_name("generated_cuda.sha256.json")
SHAPE = "x".join(map(str, CANONICAL_SHAPE))

# a declaration: a type word (with pointer/reference marks), then the declared name, then = [ ; , or )
_DECLARED = re.compile(r"\b[A-Za-z_]\w*(?:\s*[*&])*\s+([A-Za-z_]\w*)\s*(?=[=\[;,)])")
_NOT_NAMES = {"return", "else", "case", "goto", "const", "volatile", "__restrict__", "main_kernel"}
_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")


_DYNAMIC_SMEM_POINTER = re.compile(r"^ *void\* \w+ = \(\(void\*\)\(\(char\*\)buf_dyn_shmem \+ (\d+)\)\);\n", re.M)


def normalised(source: str) -> str:
    """``source`` with its dynamic shared memory pointers replaced by their sorted offsets, then every
    identifier it declares renamed to ``v<n>``, n in order of first appearance."""
    declared = {m.group(1) for m in _DECLARED.finditer(source)} - _NOT_NAMES
    offsets = sorted(int(off) for off in _DYNAMIC_SMEM_POINTER.findall(source))
    first = _DYNAMIC_SMEM_POINTER.search(source)
    if first:
        source = (source[:first.start()] + f"// dynamic shared memory pointers at {offsets}\n"
                  + _DYNAMIC_SMEM_POINTER.sub("", source[first.start():]))
    names: dict[str, str] = {}

    def rename(m: re.Match) -> str:
        word = m.group(0)
        if word not in declared:
            return word
        return names.setdefault(word, f"v{len(names)}")

    return _IDENT.sub(rename, source)


def configured_kernels() -> list[tuple[str, str, str]]:
    """(variant, target, tile) of every TileLang kernel the default config compiles at its compile-check shape."""
    load_all()
    plan = Plan(DEFAULT_CONFIG)
    return sorted({(plan.impl(e).name, target, tile) for e in plan.entries if plan.is_tilelang(e)
                   for target, tile, _ in plan.check_compile_jobs(e)})


def check_shape(tile: str) -> str:
    """The shape the compile check builds ``tile`` at: the canonical one, K raised for a split tile."""
    return compile_check_shape(SHAPE, parse_tile(tile))


def key(variant: str, target: str, tile: str) -> str:
    return f"{variant}/{target}/{tile}/{check_shape(tile)}"


def _newest_kernel_source() -> float:
    """The mtime of the newest file a kernel's generated CUDA can depend on."""
    files = [*(REPO / "kernels").rglob("*.py"), *(REPO / "kernels").rglob("*.cuh"), REPO / "harness/compile.py"]
    return max(f.stat().st_mtime for f in files)


def main_job_outcome(variant: str, target: str, tile: str, newer_than: float) -> tuple[str, str | None] | None:
    """(status, kernel source) of the main job's compile of this kernel (results/compile/), if it was written
    after every kernel source file (as under .ci/run, where the main job compiled this checkout just
    before); None otherwise (the caller compiles)."""
    record = REPO / "results/compile" / variant / target / f"{tile}.json"
    if not record.exists() or record.stat().st_mtime <= newer_than:
        return None
    shape = check_shape(tile)
    rec = next((r for r in json.loads(record.read_text())["records"] if r["shape"] == shape), None)
    if rec is None or rec["status"] != "ok":
        return None if rec is None else (rec["status"], None)
    return "ok", (REPO / "results/compile" / variant / "artifacts" / target / tile / shape / "kernel.cu").read_text()


def test_renaming_is_consistent_and_keeps_everything_else():
    a = "int gi = 0;\n  int gi_1 = 0;\n  gi_1 = gi + 1;\n  tl::tma_load(X_desc, full[gi]);"
    b = "int g = 0;\n  int h = 0;\n  h = g + 1;\n  tl::tma_load(X_desc, full[g]);"
    assert normalised(a) == normalised(b)
    assert "tl::tma_load" in normalised(a) and "full" in normalised(a)  # only declared names are renamed
    swapped = "int g = 0;\n  int h = 0;\n  g = h + 1;\n  tl::tma_load(X_desc, full[g]);"
    assert normalised(a) != normalised(swapped)  # which variable is used where still counts


def test_which_same_named_buffer_lies_first_in_shared_memory_does_not_count():
    decls = "  void* A_s = ((void*)((char*)buf_dyn_shmem + {}));\n  void* A_s_1 = ((void*)((char*)buf_dyn_shmem + {}));\n"
    body = "  f(A_s);\n  g(A_s_1);\n"
    assert normalised(decls.format(0, 4096) + body) == normalised(decls.format(4096, 0) + body)
    assert normalised(decls.format(0, 4096) + body) != normalised(decls.format(0, 8192) + body)


@pytest.mark.compile
def test_generated_cuda_of_every_configured_tile_is_unchanged(kernels):
    """Reads the main job's compiled kernels where they are newer than the kernel sources (under .ci/run),
    else the kernels the suite compiles once per session."""
    held = json.loads(HASHES.read_text())
    newest = _newest_kernel_source()
    found = {}
    for variant, target, tile in configured_kernels():
        outcome = main_job_outcome(variant, target, tile, newest)
        if outcome is None:
            compiled = kernels(variant, tile, target, parse_shape(check_shape(tile)))
            outcome = compiled.record["status"], compiled.source if compiled.record["status"] == "ok" else None
        status, source = outcome
        found[key(variant, target, tile)] = (hashlib.sha256(normalised(source).encode()).hexdigest()
                                             if status == "ok" else status)
    if os.environ.get("LPGEMM_UPDATE_CUDA_HASHES"):
        HASHES.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    changed = sorted(k for k in found.keys() | held.keys() if found.get(k) != held.get(k))
    assert not changed, ("the generated CUDA changed (or a configured tile was added or removed) for:\n  "
                         + "\n  ".join(changed) + f"\nIf that is meant, see {__doc__.splitlines()[0]!r}: "
                         "this module's docstring says how to update the table")
