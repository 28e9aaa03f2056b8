"""The library peers: what each TileLang variant's speedup is taken against, called through torch.

Their launches, one-time prepares and the shape limits the libraries document; the family modules
(``kernels.baselines``, ``fp8``, ``int4``, ``blockscaled``, ``dequant``) register them beside their
emulations. A launch is the timed call, so it launches the library's kernel and nothing else: any
layout change a library wants is made once, untimed, in the prepare.
"""
from __future__ import annotations

import importlib
import json
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from kernels.dequant_formats import HUMMING_GROUP, TINYGEMM_GROUP, W4Format, decode_weight_bf16
from kernels.formats import OperandTypeError, ceil_div, format_operands, round_up
from kernels.registry import Operands, Unsupported

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


def _humming_layer(B: torch.Tensor, scales: torch.Tensor):
    """humming's layer on codes and scales of w4_humming_int4_g128, its weight layout made on their device
    (``transform``)."""
    N, K = B.shape[0], B.shape[1] * 8
    humming = import_humming()
    layer = humming.layer.HummingLayer(
        shape_n=N, shape_k=K, weight_config={"dtype": "int4", "group_size": HUMMING_GROUP},
        torch_dtype=torch.bfloat16).to(B.device)
    layer.load_from_tensors({"weight": B, "weight_scale": scales})
    layer.transform()
    return layer


def _humming_tuning(layer, M: int) -> str:
    """The config humming's heuristics choose for M rows on this layer (JSON, as its forward takes it)."""
    return json.dumps(import_humming().tune.get_heuristics_config(layer.humming_config, shape_m=M))


def prepare_humming(ops: Operands) -> Operands:
    """humming's layer on the stored codes and scales, its weight layout made on the GPU (``transform``), and
    the kernel its heuristics choose for this M compiled (NVRTC) by one call: all untimed. The layer and the
    chosen config (JSON, as humming's forward takes it) are what the launch reads."""
    A, B, scales = ops["A"], ops["B"], ops["scales"]
    import_humming()  # first: a host without it is told so, whatever the operands
    if not A.is_cuda:
        raise RuntimeError(f"humming runs on the GPU only; the operands are on {A.device}")
    try:
        layer = _humming_layer(B, scales)
        tuning = _humming_tuning(layer, A.shape[0])
        layer(A, tuning_config=tuning)  # compiles the kernel (unless precompile_humming did), checks that it runs
        torch.cuda.synchronize()
    except RuntimeError as e:
        if (explained := _with_compiler_errors(e)) is e:
            raise  # as it is (an out-of-memory error stays one)
        raise explained from e
    return {HUMMING_LAYER: layer, HUMMING_TUNING: tuning}


def precompile_humming(shapes: list[tuple[int, int, int]]) -> None:
    """Compile, all at once on the host's cores, the kernels humming's heuristics choose at these shapes
    (M, N, K), which ``prepare_humming`` would otherwise compile one shape after another (NVRTC, seconds each,
    while the GPU job waits). Each (N, K) gets a layer on weights of value 0 (code 8) and unit scales for its
    config; the cubins land in humming's caches, where each shape's prepare then finds them. (humming reads the
    codes: where none is 0, i.e. -8, as in every w4_int4_sym_g128 weight, it takes them as sign and magnitude,
    float4e0m3, another kernel; all-zero words would give uint4.) A warm-up only: prepare compiles, and reports,
    whatever this does not. On the current CUDA device."""
    import_humming()  # its caches set before any of it is imported
    from humming.kernel.humming import HummingKernel

    by_weight: dict[tuple[int, int], list[int]] = {}
    for M, N, K in shapes:
        by_weight.setdefault((N, K), []).append(M)
    device = torch.device("cuda", torch.cuda.current_device())
    wanted = set()
    for (N, K), rows in by_weight.items():
        eights = torch.full((N, K // 8), -0x77777778, dtype=torch.int32, device=device)  # 0x88888888: code 8 x 8
        layer = _humming_layer(eights, torch.ones(N, K // HUMMING_GROUP, dtype=torch.bfloat16, device=device))
        wanted |= {(layer.humming_config.to_str(), _humming_tuning(layer, M)) for M in rows}
        del layer
    with ThreadPoolExecutor(max_workers=max(1, min(len(wanted), os.cpu_count() or 1))) as pool:
        # the same call and arguments as humming's forward makes (its kernel cache is keyed by them)
        list(pool.map(lambda w: HummingKernel.prepare_kernels(w[0], None, w[1], device), sorted(wanted)))


def launch_humming(kernel, ops: Operands) -> torch.Tensor:
    layer, tuning = ops[HUMMING_LAYER], ops[HUMMING_TUNING]  # prepare's layer first, then the stored A
    return layer(ops["A"], tuning_config=tuning)


# ---- fbgemm (fbgemm-gpu-genai, optional): FBGEMM's CUTLASS fp8 GEMM of the DeepSeek recipe ------------------
# torch.ops.fbgemm.f8f8bf16_groupwise(XQ, WQ, x_scale, w_scale) -> bf16 (M, N), on the stored operands of
# deepseek_1x128_128x128 (A (M, K) and B (N, K) e4m3, contiguous) and its fp32 scales in the layouts its kernels
# read, made once in the prepare. What FBGEMM v1.6.0 holds (fbgemm_gpu/experimental/gen_ai/src/quantize/):
# - quantize_defs.cpp: the schema above; quantize.cpp registers its implementation in CUDA builds (not ROCm).
# - cutlass_extensions/f8f8bf16_groupwise.cu: without FBGEMM_AUTOTUNE_ENABLE in the environment, a heuristic on M
#   picks one of two CUTLASS 3 sm90 kernels: M <= 16 a 128x16x128 tile, cluster 1x1x1, ping-pong schedule; else a
#   128x128x128 tile, cluster 1x2x1, cooperative schedule. (With the variable set it would tune over the list of
#   f8f8bf16_groupwise_manifest.cuh, which is empty in 1.6.0: "Kernels to tune over is empty.")
# - cutlass_extensions/f8f8bf16_groupwise/f8f8bf16_groupwise_common.cuh: XQ and WQ must be CUDA and contiguous, the
#   scales fp32 (TORCH_CHECKs); the kernel (KernelTmaWarpSpecialized{Pingpong,Cooperative}FP8BlockScaledAccum,
#   ArchTag Sm90: wgmma, sm_90a) runs the transposed problem (N, M, K) with WQ as its row-major left operand; the
#   scales are read through raw pointers in the layouts of CUTLASS's Sm90BlockwiseScaleConfig<1, 128, 128>, whose
#   default is MN-major (external/cutlass at 571edeb, include/cutlass/detail/blockwise_scale_layout.hpp): x_scale
#   element (m, kb) at kb·M + m, w_scale element (nb, kb) at kb·⌈N/128⌉ + nb. Nothing checks their shapes or
#   strides, and gemm.can_implement is commented out: the shape limit below states what its TMA needs.
# - bench/quantize_ops.py (FP8CutlassGroupwiseGemm) makes the same layouts: quantize_fp8_group(x, k_major=False)
#   gives x_scale [⌈K/128⌉, M], quantize_fp8_block(w, 128, 128, k_major=False) w_scale [⌈K/128⌉, ⌈N/128⌉];
#   both are dequantizing scales (x ≈ q·scale), as this project's are.
# fbgemm_gpu is imported on first use only: it is an optional GPU-host library (pyproject.toml's extra "fbgemm";
# docs/operations.md: its offline sm_90a bundle), absent on CI and CPU hosts.
FBGEMM_DIST, FBGEMM_VERSION = "fbgemm-gpu-genai", "1.6.0"
FBGEMM_MODULE = "fbgemm_gpu.experimental.gen_ai"  # importing it loads the library that registers torch.ops.fbgemm
FBGEMM_SMALL_M = 16  # its heuristic: up to this M the 128x16 kernel, above it the 128x128 one
# its scale blocks, Sm90BlockwiseScaleConfig<1, 128, 128>: K and N granularity, those of deepseek_1x128_128x128 (not
# imported from kernels.blockscaled_formats, which every family's jobs would then depend on through this module)
FBGEMM_SCALE_BLOCK = 128
FBGEMM_CC = (9, 0)  # its kernels are sm_90a (Hopper) only (fbgemm_groupwise_gpu_problem)
# the operands prepare_fbgemm_groupwise_fp8 adds: the op, and the two scale tensors in its layouts
FBGEMM_OP, FBGEMM_X_SCALE, FBGEMM_W_SCALE = "fbgemm_groupwise_op", "fbgemm_x_scale", "fbgemm_w_scale"


def fbgemm_groupwise_fp8_shape_limit(M: int, N: int, K: int) -> str | None:
    """What fbgemm's f8f8bf16_groupwise cannot take, since 1.6.0 checks none of it (can_implement is commented out):
    K whole scale blocks of 128 (one per K tile of both kernels; a partial last block is refused here, not risked),
    N % 8 (the TMA store of the bf16 output needs 16-byte rows; A's and B's TMA loads need K % 16, which K % 128
    gives), and above M = 16 M % 4: the 128x128 kernel loads x_scale with TMA (IsTmaLoadSFB in CUTLASS's
    sm90_mma_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp: at least 32 MN-major scales per tile, here the
    tile's 128 rows of A, against one of B), and the pitch between its K blocks, M floats, must be a multiple of 16
    bytes. The 128x16 kernel (M <= 16) loads it with cp.async, element by element."""
    problems = []
    if K % FBGEMM_SCALE_BLOCK:
        problems.append(f"K={K} must be a multiple of {FBGEMM_SCALE_BLOCK} (whole scale blocks: one per K tile of its kernels)")
    if N % 8:
        problems.append(f"N={N} must be a multiple of 8 (the TMA store of its bf16 output needs 16-byte rows)")
    if M > FBGEMM_SMALL_M and M % 4:
        problems.append(f"M={M} must be a multiple of 4 when M > {FBGEMM_SMALL_M} (its 128x128 kernel loads the 1x128 "
                        "scales with TMA: the pitch between their K blocks, M floats, must be 16 bytes)")
    return "fbgemm f8f8bf16_groupwise cannot run this shape: " + "; ".join(problems) if problems else None


def fbgemm_groupwise_scales(ops: Operands, who: str = "fbgemm_groupwise_scales") -> tuple[torch.Tensor, torch.Tensor]:
    """deepseek_1x128_128x128's scales as f8f8bf16_groupwise reads them: (x_scale, w_scale), fp32, contiguous.

    x_scale (⌈K/128⌉, M), element (kb, m) = SFA[m, kb]: the stored M-major ``SFA_t`` without its padding rows, so a
    view of it where M % 4 == 0 (its pitch is then M) and one copy otherwise; w_scale (⌈K/128⌉, ⌈N/128⌉), element
    (kb, nb) = SFB[nb, kb], a copy (⌈N/128⌉·⌈K/128⌉ floats). Made once, untimed; OperandTypeError where the operands
    are not the format's (fbgemm reinterprets its inputs' bytes and checks neither dtype nor scale shape)."""
    A, B, sfa_t, sfb = format_operands(ops, ("A", "B", "SFA_t", "SFB"), who)
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[1]:
        raise OperandTypeError(f"{who}: A must be (M, K) and B (N, K), got {tuple(A.shape)} and {tuple(B.shape)}")
    (M, K), N = A.shape, B.shape[0]
    if A.dtype != torch.float8_e4m3fn or B.dtype != torch.float8_e4m3fn:
        raise OperandTypeError(f"{who}: A and B must be torch.float8_e4m3fn (its kernels read e4m3), got {A.dtype} "
                               f"and {B.dtype}")
    kb = ceil_div(K, FBGEMM_SCALE_BLOCK)
    if sfa_t.dtype != torch.float32 or sfa_t.ndim != 2 or sfa_t.shape[0] != kb or sfa_t.shape[1] < M:
        raise OperandTypeError(f"{who}: SFA_t must be fp32 (⌈K/128⌉, ≥ M) = ({kb}, ≥ {M}), got {sfa_t.dtype} "
                               f"{tuple(sfa_t.shape)}")
    if sfb.dtype != torch.float32 or tuple(sfb.shape) != (ceil_div(N, FBGEMM_SCALE_BLOCK), kb):
        raise OperandTypeError(f"{who}: SFB must be fp32 (⌈N/128⌉, ⌈K/128⌉) = ({ceil_div(N, FBGEMM_SCALE_BLOCK)}, {kb}), got "
                               f"{sfb.dtype} {tuple(sfb.shape)}")
    return sfa_t[:, :M].contiguous(), sfb.T.contiguous()


def import_fbgemm_groupwise():
    """torch.ops.fbgemm.f8f8bf16_groupwise, its library loaded now; RuntimeError saying what is missing when it
    cannot be: not installed, installed without what it needs at import, or a build without the op."""
    try:
        importlib.import_module(FBGEMM_MODULE)
    except ModuleNotFoundError as e:
        if e.name in ("fbgemm_gpu", "fbgemm_gpu.experimental", FBGEMM_MODULE):
            raise RuntimeError(f"{FBGEMM_DIST} is not installed on this host: the fbgemm peer needs "
                               f"{FBGEMM_DIST}=={FBGEMM_VERSION} (pip install '.[fbgemm]', or the offline sm_90a "
                               f"bundle of docs/operations.md; no module {e.name!r})") from e
        raise RuntimeError(f"{FBGEMM_DIST} cannot be imported, a module it needs is missing: {e}") from e
    except Exception as e:  # its library fails to load (a CUDA library, torch's ABI)
        raise RuntimeError(f"{FBGEMM_DIST} cannot be imported: {type(e).__name__}: {e}") from e
    try:
        return torch.ops.fbgemm.f8f8bf16_groupwise
    except (AttributeError, RuntimeError) as e:
        raise RuntimeError(f"{FBGEMM_DIST} is installed but registers no torch.ops.fbgemm.f8f8bf16_groupwise: "
                           f"{e}") from e


def fbgemm_groupwise_gpu_problem(cc: tuple[int, int]) -> str | None:
    """Why a GPU of compute capability ``cc`` cannot run it, or None: its kernels are sm_90a only, and 1.6.0's
    heuristic would launch them on any other GPU too: the wheel's sm_100a copies of them print an error and exit
    (cuobjdump -sass), leaving the output unwritten."""
    if tuple(cc) == FBGEMM_CC:
        return None
    return (f"{FBGEMM_DIST} {FBGEMM_VERSION}'s f8f8bf16_groupwise has CUTLASS sm90 (sm_90a) kernels only; this GPU is "
            f"compute capability {cc[0]}.{cc[1]}")


def prepare_fbgemm_groupwise_fp8(ops: Operands) -> Operands:
    """The op and the two scale tensors in its layouts (``fbgemm_groupwise_scales``), made once with the operands,
    so that the launch calls the op and nothing else; Unsupported on a GPU other than sm_90
    (``fbgemm_groupwise_gpu_problem``)."""
    x_scale, w_scale = fbgemm_groupwise_scales(ops, "prepare_fbgemm_groupwise_fp8")
    A = ops["A"]
    # a GPU it has no kernels for is a refusal whether the library is installed there or not
    if A.is_cuda and (why := fbgemm_groupwise_gpu_problem(torch.cuda.get_device_capability(A.device))):
        raise Unsupported(why)
    op = import_fbgemm_groupwise()
    if not A.is_cuda:
        raise RuntimeError(f"fbgemm's f8f8bf16_groupwise runs on the GPU only; the operands are on {A.device}")
    return {FBGEMM_OP: op, FBGEMM_X_SCALE: x_scale, FBGEMM_W_SCALE: w_scale}


def launch_fbgemm_groupwise_fp8(kernel, ops: Operands) -> torch.Tensor:
    return ops[FBGEMM_OP](ops["A"], ops["B"], ops[FBGEMM_X_SCALE], ops[FBGEMM_W_SCALE])
