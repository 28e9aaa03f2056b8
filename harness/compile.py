"""Compile a variant's TileLang kernel for one hardware target, on any host (no GPU needed).

TileLang caches compiled kernels on disk (``TILELANG_CACHE_DIR``), so the run step's call of
``build`` with the same arguments reloads what the compile step produced instead of recompiling.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from harness import sass
from harness.atomic import atomic_path
from harness.jobs import interrupted
from kernels.registry import Unsupported, Variant, pass_configs_for
from kernels.tiles import Tile, register_problem, smem_problem

# instruction classes looked for in the generated CUDA source, most specific first
INSTRUCTION_CLASSES = {
    "tcgen05": r"tcgen05|tl::tcgen5",
    "wgmma": r"wgmma",
    "mma_sync": r"mma_sync|mma\.sync|tl::mma<",
}


class UnsupportedTarget(Unsupported):
    """The variant cannot be built for this target: a declared arch rule or a recognised TileLang refusal."""


@dataclass(frozen=True)
class RefusalRule:
    """TileLang's refusal of a dtype or an instruction for a target, recognised by its exception text."""

    name: str
    pattern: str  # regex searched in str(exception)
    meaning: str


# The only compiler errors recorded as unsupported; every other exception is a failure. Each pattern is
# the message TileLang 0.1.15 really raises (tests/test_compile.py feeds each its own and others' texts).
TILELANG_REFUSALS = (
    # int4_mma on sm_90a / sm_100a with warp specialization on: the TMA descriptor has no 4-bit dtype
    RefusalRule(
        "int4_tma",
        r"Check failed: \(0\) is false: int4\b",
        "TileLang's TMA lowering has no 4-bit dtype: T.int4 operands cannot be TMA-loaded on this target",
    ),
    # T.gemm_blockscaled below sm_100; on sm_100/sm_120 the same text means a kernel bug (wrong scopes),
    # so those arches are excluded
    RefusalRule(
        "blockscaled_mma_target",
        r'Block-scaled GEMM requires either Blackwell SM100 TCGEN5MMA .*? but got target=\{.*?"arch":"sm_(?!10\d|12\d)',
        "T.gemm_blockscaled lowers only to sm_100 tcgen05 or sm_120 mma.sync, not to this target",
    ),
)


def known_refusal(exc: BaseException) -> RefusalRule | None:
    text = str(exc)
    return next((r for r in TILELANG_REFUSALS if re.search(r.pattern, text, re.DOTALL)), None)


def error_summary(exc: BaseException, limit: int = 500) -> str:
    """``Type: message``, whitespace collapsed and trimmed. For a failed nvcc/ptxas build only its error
    lines are kept: TileLang's message also holds the whole CUDA source, every warning and the command."""
    text = str(exc)
    if "Compilation error:" in text:
        diagnostics = text.split("Compilation error:", 1)[1].split("\nCommand:", 1)[0]
        errors = [ln.strip() for ln in diagnostics.splitlines() if re.search(r"\b(error|fatal)\b", ln)]
        text = " | ".join(errors) or diagnostics
    text = " ".join(text.split())
    return f"{type(exc).__name__}: {text[:limit]}{' ...' if len(text) > limit else ''}"


def target_dict(arch: str) -> dict:
    # TileLang wants a dict: "cuda -arch=sm_90a" is rejected and bare "cuda" guesses an old arch off-GPU
    return {"kind": "cuda", "arch": arch}


def build(variant: Variant, M: int, N: int, K: int, tile: Tile, arch: str):
    """Compile (or load from TileLang's cache) the variant's kernel.

    Raises Unsupported for a known refusal only: a declared arch rule, a shape rule the kernel factory
    documents (registry.Unsupported), or a TILELANG_REFUSALS match (UnsupportedTarget). Anything else
    (a tile that does not fit: ValueError; nvcc, ptxas, a Python bug) propagates as it is.
    """
    import tilelang

    if variant.kernel is None:
        raise ValueError(f"{variant.name} is a library baseline: nothing to compile")
    if arch in variant.unsupported:
        raise UnsupportedTarget(variant.unsupported[arch])
    prim = variant.kernel(M, N, K, tile)
    keep_ptx_of_cubin_builds()
    try:
        return tilelang.compile(
            prim,
            out_idx=list(variant.out_idx),
            target=target_dict(arch),
            pass_configs=pass_configs_for(variant, arch, tile),
        )
    except Exception as e:
        if rule := known_refusal(e):
            raise UnsupportedTarget(f"{rule.meaning} ({arch}; rule {rule.name}: {error_summary(e)})") from e
        raise


def instruction_classes(source: str) -> list[str]:
    return [name for name, pat in INSTRUCTION_CLASSES.items() if re.search(pat, source)]


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


def sass_record(kernel, artifacts: Path) -> dict:
    """The kernel's cubin and SASS written under ``artifacts``, and what the SASS shows (harness/sass.py);
    ``sass_error`` instead when they cannot be had."""
    try:
        sass.tools()  # a missing disassembler is named first, whatever else this host lacks
        cubin = artifacts / "kernel.cubin"
        cubin.write_bytes(sass.kernel_cubin(kernel))
        text = sass.disassemble(cubin)
        (artifacts / "kernel.sass").write_text(text)
        return sass.summarize(text, sass.resource_usage(cubin)) | {"sass_tool": sass.tool_version()}
    except Exception as e:  # recorded: without SASS the instruction check fails with this reason
        return {"sass_error": error_summary(e)}


def resource_check(arch: str, rec: dict, threads: int) -> str:
    """"" when the compiled kernel's resources fit one block of ``arch``, else why not: its dynamic shared
    memory (what the host launches with) plus the static (ptxas's) against kernels/tiles.py's limit, and
    its registers per thread times ``threads`` against the register file. A kernel over them compiles but
    cannot launch ("too many resources requested"); config validation estimates the same before compiling."""
    what = f"compiled kernel ({rec.get('tile', '?')})"
    dynamic = rec.get("smem_dynamic_bytes")
    if dynamic is not None:
        try:
            if why := smem_problem(what, dynamic, arch, static=rec.get("smem_static_bytes") or 0):
                return why
        except KeyError as e:
            return e.args[0]
    registers = rec.get("registers")
    if registers is not None and (why := register_problem(what, registers, threads)):
        return why
    return ""


def instruction_check(variant: Variant, arch: str, rec: dict, source: str) -> str:
    """"" when the kernel holds the instructions its variant declares for ``arch``, else why not. The SASS
    (what ptxas emitted) is checked first; the generated source second."""
    expected_sass, expected_source = variant.sass.get(arch), variant.instructions.get(arch)
    if expected_sass is None or expected_source is None:  # config validation refuses such a target
        return (f"no instruction check for {arch} (Variant.sass and Variant.instructions): the instructions it built "
                f"({sass.mma_label(rec.get('sass_mma', {}))}) cannot be verified")
    if "sass_mma" not in rec:
        return f"no SASS, so the instruction check cannot be made: {rec.get('sass_error')}"
    if why := sass.check(expected_sass, rec["sass_mma"]):
        return why
    if not re.search(expected_source, source):
        return f"expected instruction /{expected_source}/ not in the generated source (found {rec['instructions']})"
    return ""


def _ptx_file(code: str, target) -> Path:
    """Where the PTX of one CUDA source for one target is kept: beside TileLang's kernel cache, under the
    hash of everything it is a function of (the source, the target, TileLang's nvcc flags, the CUDA release)."""
    import tilelang
    from tilelang.contrib import nvcc

    key = hashlib.sha256(json.dumps([code, str(target), tilelang.__version__, nvcc.get_cuda_version()]).encode())
    return Path(tilelang.env.TILELANG_CACHE_DIR) / "lpgemm-ptx" / f"{key.hexdigest()}.ptx"


def _keep(source: Path, kept: Path) -> None:
    with atomic_path(kept) as partial:  # whole or absent, whoever reads it
        shutil.copyfile(source, partial)


@functools.cache
def keep_ptx_of_cubin_builds() -> None:
    """Once per process: TileLang's cubin build (nvcc --cubin, which compiles through PTX) keeps that PTX
    (nvcc -keep) where ``export_ptx`` looks, so that a kernel's PTX does not cost a second nvcc front-end
    pass (a third of a compile). The cubin and TileLang's cache of it are as without it."""
    import tvm_ffi
    from tilelang.contrib import nvcc
    from tilelang.cuda import backend

    tilelang_compile = backend.tilelang_callback_cuda_compile

    def compile_keeping_ptx(code, target, pass_config=None):
        compile_cuda = nvcc.compile_cuda
        with tempfile.TemporaryDirectory() as keep_dir:
            def keeping(code_, target_format="ptx", arch=None, options=None, **kwargs):
                options = [options] if isinstance(options, str) else list(options or [])
                return compile_cuda(code_, target_format, arch, options=[*options, "-keep", f"-keep-dir={keep_dir}"], **kwargs)

            nvcc.compile_cuda = keeping
            try:
                binary = tilelang_compile(code, target, pass_config)
            finally:
                nvcc.compile_cuda = compile_cuda
            ptx = sorted(Path(keep_dir).glob("*.ptx"))
            if len(ptx) == 1:  # none when the cubin came from TileLang's cache
                _keep(ptx[0], _ptx_file(code, target))
        return binary

    tvm_ffi.register_global_func("tilelang_callback_cuda_compile", f=compile_keeping_ptx, override=True)


def export_ptx(kernel, path: Path) -> None:
    """The kernel's PTX at ``path``: the one its cubin build kept (``keep_ptx_of_cubin_builds``), else
    TileLang's export (nvcc -ptx on the CUDA source once more), which is then kept too, so that a kernel
    loaded from TileLang's cache (a rerun, a forced recompile, the tests after the main job) has it at once."""
    kept = None if kernel.compile_flags else _ptx_file(kernel.get_kernel_source(), kernel.target)
    if kept is not None and kept.is_file():
        shutil.copyfile(kept, path)
        return
    kernel.export_ptx(str(path))  # logs, and writes nothing, when nvcc fails
    if kept is not None and path.is_file():
        _keep(path, kept)


def compile_record(variant: Variant, M: int, N: int, K: int, tile: Tile, arch: str, artifacts: Path) -> dict:
    """Compile one kernel and describe the outcome; never raises for a target that cannot build it.

    status: ok | unsupported (a known refusal: see ``build``) | failed (anything else: the row's reason
    is ``Type: message``, the traceback goes to stdout, i.e. the rule's log; or more shared memory or
    registers than a block of ``arch`` has (``resource_check``); or no instruction check for
    the target; or no SASS; or compiled to other instructions than declared, in the SASS or the source).
    CUDA source, PTX, cubin and SASS are written under ``artifacts``.
    """
    rec: dict = {"variant": variant.name, "target": arch, "tile": tile.name, "M": M, "N": N, "K": K}
    t0 = time.perf_counter()
    try:
        kernel = build(variant, M, N, K, tile, arch)
    except Unsupported as e:
        return rec | {"status": "unsupported", "reason": str(e)}
    except Exception as e:  # data, not a crash of the DAG: the other tiles and targets still compile
        if interrupted():  # nvcc stopped by the job's interrupt: no outcome to record
            raise KeyboardInterrupt from e
        print(f"compile of {variant.name} {tile.name} {M}x{N}x{K} for {arch} failed:", flush=True)
        traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
        return rec | {"status": "failed", "reason": error_summary(e)}
    rec["compile_s"] = round(time.perf_counter() - t0, 3)
    artifacts.mkdir(parents=True, exist_ok=True)
    source = kernel.get_kernel_source()
    (artifacts / "kernel.cu").write_text(source)
    rec["instructions"] = instruction_classes(source)
    try:
        export_ptx(kernel, artifacts / "kernel.ptx")
    except Exception as e:
        rec["ptx_error"] = f"{type(e).__name__}: {e}"
    rec |= sass_record(kernel, artifacts)
    rec["smem_dynamic_bytes"] = dynamic_smem_bytes(kernel)
    # over a block's limits the kernel compiles but can never launch: failed (unsupported is for declared
    # or recognised refusals only), so a GPU run neither checks nor times it
    why = "; ".join(filter(None, [instruction_check(variant, arch, rec, source), resource_check(arch, rec, tile.threads)]))
    return rec | {"status": "failed" if why else "ok", "reason": why}
