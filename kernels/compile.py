"""Compile a variant's TileLang kernel for one hardware target, on any host (no GPU needed).

TileLang caches compiled kernels on disk (``TILELANG_CACHE_DIR``), so the run step's call of
``build`` with the same arguments reloads what the compile step produced instead of recompiling.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from kernels.registry import Variant
from kernels.tiles import Tile

# instruction classes looked for in the generated CUDA source, most specific first
INSTRUCTION_CLASSES = {
    "tcgen05": r"tcgen05|tl::tcgen5",
    "wgmma": r"wgmma",
    "mma_sync": r"mma_sync|mma\.sync|tl::mma<",
}


# exceptions that mean our Python is wrong rather than that TileLang refused the target
PYTHON_BUGS = (NameError, AttributeError, ImportError, SyntaxError)


class UnsupportedTarget(Exception):
    """The variant cannot be built for this target; the message says why."""


class InstructionCheckFailed(Exception):
    """The kernel compiled but not to the instruction it is meant to use (e.g. mma.sync instead of wgmma)."""


def target_dict(arch: str) -> dict:
    # TileLang wants a dict: "cuda -arch=sm_90a" is rejected and bare "cuda" guesses an old arch off-GPU
    return {"kind": "cuda", "arch": arch}


def build(variant: Variant, M: int, N: int, K: int, tile: Tile, arch: str):
    """Compile (or load from TileLang's cache) the variant's kernel; raises UnsupportedTarget."""
    import tilelang

    if variant.kernel is None:
        raise ValueError(f"{variant.name} is a library baseline: nothing to compile")
    if arch in variant.unsupported:
        raise UnsupportedTarget(variant.unsupported[arch])
    prim = variant.kernel(M, N, K, tile)
    return tilelang.compile(
        prim,
        out_idx=list(variant.out_idx),
        target=target_dict(arch),
        pass_configs=variant.pass_configs.get(arch) or None,
    )


def instruction_classes(source: str) -> list[str]:
    return [name for name, pat in INSTRUCTION_CLASSES.items() if re.search(pat, source)]


def ptxas_usage(ptx: Path, arch: str) -> dict:
    """Registers, spills and static shared memory from ``ptxas -v``; empty when ptxas is absent."""
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [ptxas, "-v", f"--gpu-name={arch}", str(ptx), "-o", str(Path(tmp) / "k.cubin")],
            capture_output=True,
            text=True,
        )
    text = proc.stdout + proc.stderr
    usage: dict = {}
    if m := re.search(r"Used (\d+) registers", text):
        usage["registers"] = int(m.group(1))
    if m := re.search(r"(\d+) bytes smem", text):
        usage["smem_static_bytes"] = int(m.group(1))
    if m := re.search(r"(\d+) bytes spill stores", text):
        usage["spill_store_bytes"] = int(m.group(1))
    return usage


def dynamic_smem_bytes(kernel) -> int | None:
    """Dynamic shared memory the host code launches with (its last launch argument), if any."""
    if "buf_dyn_shmem" not in kernel.get_kernel_source():
        return 0
    host = kernel.get_host_source()
    calls = re.findall(r"TVMFFIFunctionCall\(\w+_packed, \(TVMFFIAny\*\) stack_ffi_any, (\d+)", host)
    if not calls:
        return None
    last = int(calls[-1]) - 1
    vals = re.findall(rf"stack_ffi_any\)\[{last}\]\.v_int64\) = \(\(int64_t\)(\d+)\)", host)
    return int(vals[-1]) if vals else None


def compile_record(variant: Variant, M: int, N: int, K: int, tile: Tile, arch: str, artifacts: Path) -> dict:
    """Compile one kernel and describe the outcome; never raises for a target that cannot build it.

    status: ok | unsupported (declared, or the compiler refused the target) | failed (compiled to the
    wrong instructions, or another error). CUDA source and PTX are written under ``artifacts``.
    """
    rec: dict = {"variant": variant.name, "target": arch, "tile": tile.name, "M": M, "N": N, "K": K}
    t0 = time.perf_counter()
    try:
        kernel = build(variant, M, N, K, tile, arch)
    except UnsupportedTarget as e:
        return rec | {"status": "unsupported", "reason": str(e)}
    except PYTHON_BUGS as e:  # a bug in the kernel factory is a failure, not a target limitation
        return rec | {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
    except Exception as e:  # the compiler's own refusal is data, not a crash of the DAG
        msg = " ".join(str(e).split())
        return rec | {"status": "unsupported", "reason": f"{type(e).__name__}: {msg[-400:]}"}
    rec["compile_s"] = round(time.perf_counter() - t0, 3)
    artifacts.mkdir(parents=True, exist_ok=True)
    source = kernel.get_kernel_source()
    (artifacts / "kernel.cu").write_text(source)
    rec["instructions"] = instruction_classes(source)
    try:
        kernel.export_ptx(str(artifacts / "kernel.ptx"))
        rec |= ptxas_usage(artifacts / "kernel.ptx", arch)
    except Exception as e:
        rec["ptx_error"] = f"{type(e).__name__}: {e}"
    rec["smem_dynamic_bytes"] = dynamic_smem_bytes(kernel)
    expected = variant.instructions.get(arch)
    if expected and not re.search(expected, source):
        return rec | {
            "status": "failed",
            "reason": f"expected instruction /{expected}/ not in the generated source (found {rec['instructions']})",
        }
    return rec | {"status": "ok", "reason": ""}
