"""The library peers: what each TileLang variant's speedup is taken against, called through torch.

Their launches, one-time prepares and the shape limits the libraries document; the family modules
(``kernels.baselines``, ``fp8``, ``int4``, ``blockscaled``, ``dequant``) register them beside their
emulations. A launch is the timed call, so it launches the library's kernel and nothing else: any
layout change a library wants is made once, untimed, in the prepare.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import torch

from kernels.dequant_formats import HUMMING_GROUP, TINYGEMM_GROUP, W4Format, decode_weight_bf16
from kernels.formats import round_up
from kernels.registry import Operands

# ---- cuBLAS bf16 (cublas_bf16): the unquantized GEMM ---------------------------------------------


def launch_cublas_bf16(kernel, ops: Operands) -> torch.Tensor:
    """torch.matmul of the bf16 operands (cuBLAS on the GPU); with no kernel also cublas_bf16's emulation."""
    return torch.matmul(ops["A"], ops["B"].T)


# ---- cuBLASLt fp8, tensorwise scales (cublas_fp8_e4m3, cublas_fp8_e4m3_fastacc) -------------------


def cublaslt_fp8_shape_limit(M: int, N: int, K: int) -> str | None:
    """cuBLASLt fp8 GEMMs need 16-element aligned leading dimensions; torch checks N and K. The shape
    limit of cublas_fp8_e4m3, cublas_fp8_e4m3_fastacc and cublas_blockwise_fp8."""
    if N % 16 or K % 16:
        return f"cuBLASLt fp8 needs N and K divisible by 16 (N={N}, K={K})"
    return None


def launch_cublas_fp8_e4m3(kernel, ops: Operands, fast_accum: bool) -> torch.Tensor:
    """torch._scaled_mm, tensorwise scales; also cublas_fp8_e4m3_fastacc's launch (``fast_accum`` True)."""
    # B (N,K) row-major transposed is the column-major (K,N) operand cuBLASLt wants.
    return torch._scaled_mm(
        ops["A"],
        ops["B"].T,
        scale_a=ops["scale_a"].reshape(()),
        scale_b=ops["scale_b"].reshape(()),
        out_dtype=torch.bfloat16,
        use_fast_accum=fast_accum,
    )


# ---- cuBLASLt fp8, DeepSeek block scales (cublas_blockwise_fp8) ----------------------------------

# torch's own refusal of a scale layout (ScaledBlas.cpp get_joint_scaling), as opposed to cuBLAS's
BLOCKWISE_LAYOUT_REFUSED = "Invalid scaling configuration"
# CUBLAS_STATUS_NOT_SUPPORTED: cuBLASLt has no blockwise kernel for some small-M / short-K shapes
# (seen on the H200 at 1x7168x2048 and 333x8192x1024); it is cuBLAS's refusal, not a failure
CUBLAS_NOT_SUPPORTED = (r"CUBLAS_STATUS_NOT_SUPPORTED", "cuBLASLt has no blockwise-scaled kernel for this shape")


def cublas_blockwise_scales(ops: Operands, pitch_multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale views in the layouts torch._scaled_mm accepts for the DeepSeek recipe.

    From ScaledBlas.cpp (is_blockwise_1x128_scaling / is_blockwise_128x128_scaling): scale_a
    (BlockWise1x128) shape (M, ⌈K/128⌉), strides (1, M) ("outer-dim major") -- a view of ``SFA_t``
    when M % 4 == 0, else a fresh copy; scale_b (BlockWise128x128, checked as scale_bᵀ against
    B (N, K)): scale_bᵀ shape (⌈N/128⌉, ⌈K/128⌉), strides (pitch, 1), where pitch is ⌈K/128⌉ in most
    versions of that file and ⌈K/128⌉ rounded up to 4 in one (``pitch_multiple=4``); both agree when
    K % 512 == 0 or when B has one 128-row block (a stride of a size-1 dimension is not checked).
    """
    M = ops["A"].shape[0]
    sfa_t = ops["SFA_t"]
    scale_a = sfa_t[:, :M].T
    if scale_a.stride() != (1, M):
        scale_a = ops["SFA"].T.contiguous().T
    sfb = ops["SFB"]
    nb, kb = sfb.shape
    pitch = round_up(kb, pitch_multiple)
    if pitch != kb:
        padded = torch.zeros(nb, pitch, dtype=sfb.dtype, device=sfb.device)
        padded[:, :kb] = sfb
        sfb = padded[:, :kb]
    return scale_a, sfb.T


def _scaled_mm_blockwise(ops: Operands, scale_a: torch.Tensor, scale_b: torch.Tensor) -> torch.Tensor:
    # B (N,K) row-major transposed is the column-major (K,N) operand cuBLASLt wants; blockwise scaling
    # forbids fast accumulation
    return torch._scaled_mm(ops["A"], ops["B"].T, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16,
                            use_fast_accum=False)


def prepare_cublas_blockwise_fp8(ops: Operands) -> Operands:
    """The scale views (or, for M % 4 != 0, the one copy) cuBLAS wants, made once with the operands so
    that no layout change runs inside the timed window.

    Where the two pitches torch builds ask of scale_b differ (``cublas_blockwise_scales``), one untimed
    call with the unpadded pitch decides: refused by torch's layout check, the operands get the padded
    one. The choice lives in the operands, never in module state."""
    scale_a, scale_b = cublas_blockwise_scales(ops)
    nb, kb = ops["SFB"].shape
    if kb % 4 and nb > 1:
        try:
            _scaled_mm_blockwise(ops, scale_a, scale_b)
        except RuntimeError as e:
            if BLOCKWISE_LAYOUT_REFUSED not in str(e):
                raise
            scale_a, scale_b = cublas_blockwise_scales(ops, pitch_multiple=4)
    return {"scale_a_blockwise": scale_a, "scale_b_blockwise": scale_b}


def launch_cublas_blockwise_fp8(kernel, ops: Operands) -> torch.Tensor:
    return _scaled_mm_blockwise(ops, ops["scale_a_blockwise"], ops["scale_b_blockwise"])


# ---- torch._int_mm (int8_torch_int_mm): cuBLASLt int8 ---------------------------------------------


def int8_torch_int_mm_shape_limit(M: int, N: int, K: int) -> str | None:
    """Why torch._int_mm (cuBLASLt int8) cannot run (M, N, K), or None: it needs M > 16, K and N
    positive multiples of 8."""
    problems = []
    if M <= 16:
        problems.append(f"M={M} must be > 16")
    if K <= 0 or K % 8:
        problems.append(f"K={K} must be a positive multiple of 8")
    if N <= 0 or N % 8:
        problems.append(f"N={N} must be a positive multiple of 8")
    return "torch._int_mm cannot run this shape: " + "; ".join(problems) if problems else None


def launch_int8_torch_int_mm(kernel, ops: Operands) -> torch.Tensor:
    a, b = ops["A"], ops["B"]
    if reason := int8_torch_int_mm_shape_limit(a.shape[0], b.shape[0], a.shape[1]):
        raise ValueError(reason)
    # B (N,K) row-major transposed is the column-major (K,N) operand cuBLASLt's int8 path wants.
    return torch._int_mm(a, b.T)


# ---- W4A16 peers: torch decode-then-matmul (torch_dequant_matmul_<format>) and tinygemm -----------


def launch_torch_dequant_matmul_w4(kernel, ops: Operands, fmt: W4Format) -> torch.Tensor:
    """Torch ops decode the whole weight to bf16, then cuBLAS multiplies: the launch of every
    torch_dequant_matmul_<format> variant."""
    return torch.matmul(ops["A"], decode_weight_bf16(ops, fmt).T)


# tinygemm (``torch._weight_int4pack_mm``, bf16 only) on its own format (kernels.dequant_formats
# ``w4_tinygemm_g128``); the layout change to its tiles runs on the GPU in the prepare, untimed
TINYGEMM_INNER_K_TILES = 8  # K tiles of 16 per packed row chunk (2, 4 or 8); 8 is torchao's default


def prepare_tinygemm(ops: Operands) -> Operands:
    """tinygemm's tiled layout of the packed codes, made on the GPU (untimed)."""
    return {"B_int4pack": torch._convert_weight_to_int4pack(ops["B"], TINYGEMM_INNER_K_TILES)}


def launch_tinygemm(kernel, ops: Operands) -> torch.Tensor:
    A, scale_and_zero = ops["A"], ops["scale_and_zero"]  # the stored operands first, then prepare's tiles
    return torch._weight_int4pack_mm(A, ops["B_int4pack"], TINYGEMM_GROUP, scale_and_zero)


def tinygemm_shape_limit(M: int, N: int, K: int) -> str | None:
    """torch's check on N (whole 8-row tiles). K must be whole groups of 128 (which are also whole K tiles
    of 16 x ``TINYGEMM_INNER_K_TILES``): the format itself refuses any other K when it quantizes."""
    return f"tinygemm: N={N} must be a multiple of 8" if N % 8 else None


# ---- humming (humming-kernels, optional): a Marlin-class W4A16 GEMM, JIT-compiled with NVRTC -----------
# On the codes and scales of w4_int4_sym_g128 in humming's layout (kernels.dequant_formats
# ``w4_humming_int4_g128``). humming is imported on first use only: it is an optional GPU-host library
# (pyproject.toml's extra "humming"; docs/operations.md: its offline wheel bundle), absent on CI and CPU hosts.
HUMMING_DIST, HUMMING_VERSION = "humming-kernels", "0.1.20"
HUMMING_ROW_TILE = 64  # its transform() asserts N % 64 (transform_humming_weight) and pads nothing by default
# the operands prepare_humming adds: the layer (the transformed weight and scales) and its kernel's config
HUMMING_LAYER, HUMMING_TUNING = "humming_layer", "humming_tuning_config"


def humming_shape_limit(M: int, N: int, K: int) -> str | None:
    """humming's weight layout is cut into 64-row tiles (its transform asserts N % 64). K must be whole groups of
    128 (and so of its 32-wide packed K blocks): the format itself refuses any other K when it quantizes."""
    if N % HUMMING_ROW_TILE:
        return f"humming: N={N} must be a multiple of {HUMMING_ROW_TILE} (its weight layout's row tiles)"
    return None


def _humming_cache_dirs() -> None:
    """humming's JIT cache (cubins) and lock folder, unless HUMMING_CACHE_DIR / HUMMING_TMP_DIR name them: under
    this checkout's .cache/ beside TileLang's (a warm rerun loads instead of compiling), else under /tmp.
    Set before humming is imported: it reads them once."""
    if "HUMMING_CACHE_DIR" in os.environ and "HUMMING_TMP_DIR" in os.environ:
        return
    root = Path(__file__).resolve().parents[1] / ".cache" / "humming"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only checkout
        root = Path(tempfile.gettempdir()) / f"lpgemm-humming-{os.getuid()}"
    os.environ.setdefault("HUMMING_CACHE_DIR", str(root / "cache"))
    os.environ.setdefault("HUMMING_TMP_DIR", str(root / "tmp"))
    Path(os.environ["HUMMING_TMP_DIR"]).mkdir(parents=True, exist_ok=True)  # humming creates its subfolders only


def import_humming():
    """The humming package, imported now (its caches set first); RuntimeError saying what is missing when it
    cannot be: not installed, or installed without what it needs at import (cuda-bindings, triton, ...)."""
    _humming_cache_dirs()
    try:
        import humming  # first alone: its absence is then an error naming humming itself
        import humming.layer
        import humming.tune
    except ModuleNotFoundError as e:
        if e.name == "humming":
            raise RuntimeError(f"{HUMMING_DIST} is not installed on this host: the humming peer needs "
                               f"{HUMMING_DIST}=={HUMMING_VERSION} (pip install '.[humming]', or the offline wheel "
                               "bundle of docs/operations.md)") from e
        raise RuntimeError(f"{HUMMING_DIST} cannot be imported, a module it needs is missing: {e}") from e
    except Exception as e:  # a dependency that is there but fails to load (a CUDA library, a compiled extension)
        raise RuntimeError(f"{HUMMING_DIST} cannot be imported: {type(e).__name__}: {e}") from e
    return humming


def _with_compiler_errors(e: RuntimeError) -> RuntimeError:
    """humming's failed JIT compile names only its log folder: the error lines of the compiler's log there, so
    that the row says what NVRTC (or nvcc) refused."""
    logs = re.search(r"source and compiler logs: (\S+)", str(e))
    if logs is None:
        return e
    log = Path(logs[1]) / "stderr.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    errors = [line.strip() for line in text.splitlines() if re.search(r"\b(error|fatal)\b", line, re.I)]
    return RuntimeError(f"humming's JIT compile failed: {' | '.join(errors[:3]) or str(e)} (logs: {logs[1]})")


def prepare_humming(ops: Operands) -> Operands:
    """humming's layer on the stored codes and scales, its weight layout made on the GPU (``transform``), and
    the kernel its heuristics choose for this M compiled (NVRTC) by one call: all untimed. The layer and the
    chosen config (JSON, as humming's forward takes it) are what the launch reads."""
    A, B, scales = ops["A"], ops["B"], ops["scales"]
    (M, K), N = A.shape, B.shape[0]
    humming = import_humming()
    if not A.is_cuda:
        raise RuntimeError(f"humming runs on the GPU only; the operands are on {A.device}")
    try:
        layer = humming.layer.HummingLayer(
            shape_n=N, shape_k=K, weight_config={"dtype": "int4", "group_size": HUMMING_GROUP},
            torch_dtype=torch.bfloat16).to(A.device)
        layer.load_from_tensors({"weight": B, "weight_scale": scales})
        layer.transform()
        tuning = json.dumps(humming.tune.get_heuristics_config(layer.humming_config, shape_m=M))
        layer(A, tuning_config=tuning)  # compiles the kernel, and checks that it runs
        torch.cuda.synchronize()
    except RuntimeError as e:
        if (explained := _with_compiler_errors(e)) is e:
            raise  # as it is (an out-of-memory error stays one)
        raise explained from e
    return {HUMMING_LAYER: layer, HUMMING_TUNING: tuning}


def launch_humming(kernel, ops: Operands) -> torch.Tensor:
    layer, tuning = ops[HUMMING_LAYER], ops[HUMMING_TUNING]  # prepare's layer first, then the stored A
    return layer(ops["A"], tuning_config=tuning)
