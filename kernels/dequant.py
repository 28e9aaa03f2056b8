"""Dequantize GEMM family (W4A16): C (M,N) = A · Ŵᵀ, A bf16 (M,K), W 4-bit (N,K) with group scales.

Only the weight is quantized; A is rounded to bf16. The weight is stored packed, two 4-bit codes per
byte along K (element 2i in the low nibble, 2i+1 in the high nibble: ``formats.pack_int4`` /
``formats.pack_codes``), as int8 of shape (N, K/2). Scales (and zero points) are stored group-major,
shape (K/group, N), so that one K block's scales for a tile of weight rows are one contiguous TMA box.

Formats (``kernels.dequant_formats``, which imports no kernel: the quantizers, ``dequantize``, the
bf16 decode the emulation and the torch baselines share): ``w4_int4_sym_g128`` (int4, bf16 scale amax/7
per 128 K), ``w4_uint4_zp_g128`` (uint4 with a bf16 scale and integer zero point per 128 K),
``w4_e2m1_g32`` (fp4 e2m1, bf16 scale amax/6 per 32 K), ``w4_mxfp4`` (OCP MX fp4, E8M0 scale per 32 K).

Kernel (one per format, ``dequant_<format>``), sm_90a: the weight-as-left-operand form
Cᵀ = Ŵ · Aᵀ. Each consumer warpgroup owns 64 weight rows: it decodes its packed bytes from shared
memory straight into the register fragment of ``wgmma``'s A operand (``wgmma_rs``), while the
activation tile (block_M rows, zero-filled past M by TMA) is the B operand from shared memory. So
block_M is the wgmma N (16 for decode, 256 for prefill) and the weights are never written back to
shared memory in bf16. Decode order (the emulation mirrors it): code -> exact small value v (bf16),
then one ``fma.rn.bf16x2`` v·scale + (-0): Ŵ = bf16_rn(v · scale), a single rounding of the exact
product; int4 values are made exact with the 0x4300 magic number, e2m1 values come from a byte
lookup table (code 0 -> +0.0). Accumulation is fp32 in wgmma, the output is rounded to bf16 once.
The same prim_func builds for sm_89 and sm_100a with bf16 ``mma.sync`` (untuned there). The wgmma
waits at every K block (``T.gemm``). An overlapped schedule (double-buffered fragments, async
``T.wgmma_gemm``) is not used: TileLang's pipeline frees a stage's shared buffers right after
their last use in program order, before a later ``T.wait_wgmma``, so the activation tile would
need a private copy, and with that copy ptxas serialized the wgmmas anyway (warning C7514).

Two forms, chosen by the tile (``dequant_pass_configs``): decode tiles (block_M <= 64) are built
without TileLang's warp specialization, so every thread loads (cp.async), decodes and multiplies in
~124-250 registers and several CTAs share an SM; with block_K a multiple of 256 their packed tile is
stored swizzled in shared memory (``packed_layout``) against the decoder's bank conflicts. Prefill tiles
keep TileLang's producer warpgroup and TMA loads.

The library peer is tinygemm (``torch._weight_int4pack_mm``) on its own format ``w4_tinygemm_g128``
(``kernels.dequant_formats``); the unquantized bf16 GEMM is the matched peer.

Tiles: ``m{rows of A}n{weight rows = 64 per consumer warpgroup}k{K block}_s{stages}_t{128·n/64}_wrow``;
the warps must lie along the weight rows (``_wrow``). K must be a multiple of block_K, and block_K a
multiple or a divisor of the group. TileLang evaluates a prim_func's annotations with the factory's
closure variables, so this module must not use ``from __future__ import annotations``.
"""
from functools import partial

import torch

from kernels.baselines import CUBLAS_BF16
from kernels.dequant_formats import (  # noqa: F401  (registers the formats; their helpers kept importable here)
    TINYGEMM_FORMAT,
    TINYGEMM_GROUP,
    W4_E2M1_G32,
    W4_FORMATS,
    W4_INT4_SYM_G128,
    W4_MXFP4,
    W4_UINT4_ZP_G128,
    W4Format,
    decode_weight_bf16,
    dequantize_weight,
    quantize_tinygemm_weight,
    quantize_weight,
    tinygemm_weight,
    weight_scales,
    weight_values,
)
from kernels.formats import check_gemm_shape, format_operands
from kernels.registry import Operands, Variant, register_variant
from kernels.tiles import Tile


def emulate_dequant_w4(ops: Operands, fmt: W4Format) -> torch.Tensor:
    """The kernels' arithmetic on the CPU: bf16 decoded weights, fp32 accumulation, one bf16 rounding.

    The emulation of every variant of the family (``fmt`` their format): each dequant_<format> and
    torch_dequant_matmul_<format>."""
    A = format_operands(ops, ("A",), "emulate_dequant_w4")[0]
    w = decode_weight_bf16(ops, fmt, "emulate_dequant_w4")
    return (A.float() @ w.float().T).to(torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# CUDA decoder, pasted into the kernel with T.import_source and called with T.call_extern.
# It also compiles as host C++ (the tests run it on the CPU): the two device instructions it needs,
# prmt and fma.rn.bf16x2, have host stand-ins; a host build must define dq_host_fma_bf16x2 first.
DECODE_CUDA_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#ifdef __CUDACC__
#define DQ_FN __device__ __forceinline__
#else
#define DQ_FN static inline
#endif

// byte permute: result byte i = byte sel[4i+2:4i] of the 8-byte value {b, a} (selectors < 8 only)
DQ_FN uint32_t dq_prmt(uint32_t a, uint32_t b, uint32_t sel) {
#ifdef __CUDA_ARCH__
  return __byte_perm(a, b, sel);
#else
  uint64_t x = ((uint64_t)b << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= (uint32_t)((x >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
#endif
}

// two bf16 lanes: a * b + c with one round-to-nearest-even
DQ_FN uint32_t dq_fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  return dq_host_fma_bf16x2(a, b, c);
#endif
}

DQ_FN uint32_t dq_float_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
DQ_FN float dq_bits_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

DQ_FN void dq_load16(const uint8_t* p, uint32_t w[4]) {
#ifdef __CUDA_ARCH__
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
#else
  memcpy(w, p, 16);
#endif
}

// Decode one K block of packed 4-bit weights from shared memory into this thread's part of the
// tensor-core A-operand register fragment (bf16 pairs as uint32). (This source must not name the
// matrix instructions: the compile step classifies kernels by searching their source for them.)
//   KIND 0: int4 two's complement, scale bf16; 1: uint4 with bf16 zero point z, scale bf16;
//        2: e2m1, scale bf16; 3: e2m1, scale E8M0 (uint8).
//   packed: BN rows x BK/2 bytes, row-major; scales/zeros: SG x BN (SG = K groups in the block).
//   tid: thread index among the consumer threads (one warpgroup per 64 weight rows).
// Fragment (the layout annotated on the TileLang side): thread tid holds rows
// r_h = 16*(tid/32) + (tid%32)/4 + 8h and, for every 8-wide K chunk c, the pair k = 8c + 2t, 8c + 2t + 1
// (t = tid%4) -- that pair is byte 4c + t of the row, i.e. byte t of 32-bit word c -- as frag[2c + h].
template <int KIND, int BK, int GROUP, int BN, int SWIZZLE = 0>
DQ_FN void dq_decode_fragment(void* frag_, const void* packed_, const void* scales_, const void* zeros_, int tid) {
  static_assert(BK % 32 == 0, "BK must be a multiple of 32 (16-byte row loads)");
  static_assert(BK % GROUP == 0 || GROUP % BK == 0, "BK and GROUP must divide one another");
  constexpr int SG = BK >= GROUP ? BK / GROUP : 1;
  uint32_t* frag = reinterpret_cast<uint32_t*>(frag_);
  const uint8_t* packed = reinterpret_cast<const uint8_t*>(packed_);
  const uint32_t t = (uint32_t)(tid & 3);
  const int row0 = (tid >> 5) * 16 + ((tid & 31) >> 2);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    uint32_t scale2[SG], offset2[SG];
#pragma unroll
    for (int sg = 0; sg < SG; ++sg) {
      uint32_t s;
      if (KIND == 3) {
        const uint32_t e = reinterpret_cast<const uint8_t*>(scales_)[sg * BN + row];
        s = e == 0 ? 0x0040u : (e == 255 ? 0x7FC0u : (e << 7));  // bf16 bits of 2^(e-127)
      } else {
        s = reinterpret_cast<const uint16_t*>(scales_)[sg * BN + row];
      }
      scale2[sg] = s | (s << 16);
      if (KIND == 1) {
        // -(128 + z) in both lanes: a small integer, exact in bf16
        const float z = dq_bits_float((uint32_t)reinterpret_cast<const uint16_t*>(zeros_)[sg * BN + row] << 16);
        const uint32_t o = dq_float_bits(-(128.0f + z)) >> 16;
        offset2[sg] = o | (o << 16);
      } else {
        offset2[sg] = 0xC308C308u;  // -136 = -(128 + 8): z = 8 for the XOR-biased int4 code
      }
    }
    const uint8_t* rowp = packed + row * (BK / 2);
#pragma unroll
    for (int q = 0; q < BK / 32; ++q) {
      uint32_t w[4];
      // SWIZZLE: the shared tile holds chunk q of row r at chunk q ^ (r % 8) (see packed_layout)
      dq_load16(rowp + 16 * (SWIZZLE ? (q ^ (row & 7)) : q), w);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = 4 * q + i;
        const int sg = BK >= GROUP ? (8 * c) / GROUP : 0;
        uint32_t v;
        if (KIND <= 1) {
          // x: byte 0 = byte t of w, byte 2 = byte t of w >> 4, so the masked lanes hold the low
          // and the high nibble at bits 0-3 of each half. OR-ing 0x4300 gives bf16 128 + c (c sits
          // in the mantissa: exact); XOR-ing 8 as well turns a two's complement nibble q into
          // c = q + 8. Then 1 * y + (-(128 + z)) = c - z exactly (z = 8 for int4).
          const uint32_t x = dq_prmt(w[i], w[i] >> 4, t | (t << 4) | ((t + 4) << 8) | ((t + 4) << 12));
          const uint32_t y = (x & 0x000F000Fu) ^ (KIND == 0 ? 0x43084308u : 0x43004300u);
          v = dq_fma_bf16x2(y, 0x3F803F80u, offset2[sg]);
        } else {
          // e2m1: byte tables of the bf16 bits of the magnitudes {0,.5,1,1.5,2,3,4,6}, selected by
          // the 3 magnitude bits of each nibble; the sign bit (3 of each nibble) goes to bit 15.
          const uint32_t b = dq_prmt(w[i], 0u, t | 0x4440u);
          const uint32_t sel = b & 0x77u;
          const uint32_t hi = dq_prmt(0x3F3F3F00u, 0x40404040u, sel);
          const uint32_t lo = dq_prmt(0xC0800000u, 0xC0804000u, sel);
          v = dq_prmt(lo, hi, 0x5140u) | (((b << 12) | (b << 24)) & 0x80008000u);
        }
        frag[2 * c + h] = dq_fma_bf16x2(v, scale2[sg], 0x80008000u);  // v * s + (-0): one rounding
      }
    }
  }
}
"""


def fragment_thread(i, j):
    """Thread owning element (i, j) of the decoded weight fragment (wgmma A operand, 64 rows per warpgroup)."""
    return i // 16 * 32 + i % 8 * 4 + j % 8 // 2


def fragment_index(i, j):
    """Register slot of element (i, j) in its thread's fragment (bf16 units)."""
    return j // 8 * 4 + i % 16 // 8 * 2 + j % 2


def check_tile(fmt: W4Format, K: int, tile: Tile) -> None:
    """Raise ValueError when the tile does not fit the weight-as-left-operand kernel."""
    bM, bN, bK = tile.block_M, tile.block_N, tile.block_K
    problems = []
    if tile.policy != "FullRow":
        problems.append("the warps must lie along the weight rows: use a _wrow tile")
    if bN % 64 or tile.threads != 128 * (bN // 64):
        problems.append(f"block_N (weight rows) must be 64 per consumer warpgroup: threads = 128·block_N/64 "
                        f"= {128 * max(bN // 64, 1)}, got block_N={bN}, threads={tile.threads}")
    if bM % 8 or not 8 <= bM <= 256:
        problems.append(f"block_M (rows of A, the wgmma N) must be a multiple of 8 in [8, 256], got {bM}")
    if bK % 32 or bK > 512:
        problems.append(f"block_K must be a multiple of 32 and at most 512, got {bK}")
    if bK % fmt.group and fmt.group % bK:
        problems.append(f"block_K={bK} and the group size {fmt.group} must divide one another")
    if K % bK:
        problems.append(f"K={K} must be a multiple of block_K={bK}")
    if problems:
        raise ValueError(f"tile {tile.name} does not fit {fmt.name}: " + "; ".join(problems))


# Decode tiles (block_M <= 64 rows of A) are built without TileLang's warp specialization: with it the
# one consumer warpgroup gets setmaxnreg 240, so a CTA (plus its producer warpgroup) takes a whole SM's
# registers and one CTA runs per SM with nothing to hide its latency. Without it every thread loads,
# decodes and multiplies in what it needs (124 registers at block_K 256: four CTAs per SM; 219-251 at
# 512: two), H200, notes/issue-17.md: 16x28672x8192 117 -> 67 µs. Prefill tiles keep it: without it 4096x8192x8192 took 1234 µs, not 784.
DECODE_MAX_BLOCK_M = 64


def decode_form(tile: Tile) -> bool:
    """Whether ``tile`` builds the decode form (block_M <= 64) rather than the warp-specialized prefill form."""
    return tile.block_M <= DECODE_MAX_BLOCK_M


def dequant_pass_configs(tile: Tile) -> dict:
    """The sm_90a pass configs of a dequant_<format> tile: the decode form or the prefill form."""
    return {"tl.disable_warp_specialized": True} if decode_form(tile) else {}


def swizzled_packed_tile(tile: Tile) -> bool:
    """Whether the packed weight tile is stored swizzled in shared memory: decode tiles with whole
    128-byte groups of chunks per row (block_K a multiple of 256)."""
    return decode_form(tile) and tile.block_K % 256 == 0


def packed_layout(rows: int, block_K: int):
    """Shared layout of a (rows, block_K/2) packed tile: 16-byte chunk q of row r at chunk q ^ (r % 8).

    The decoder's 8 rows per warp read the same chunk index at once; rows are block_K/2 bytes apart
    (a multiple of 128), so unswizzled they fall on the same banks (measured 6.9-way conflicts); with
    the XOR the 8 rows hit 8 different 16-byte bank groups."""
    import tilelang.language as T

    return T.Layout((rows, block_K // 2), lambda i, j: [i, ((j // 16) ^ (i % 8)) * 16 + j % 16])


def dequant_w4_kernel(M: int, N: int, K: int, tile: Tile, fmt: W4Format):
    """TileLang W4A16 GEMM, weight-as-left-operand: Cᵀ tile (block_N x block_M) = Ŵ tile · A tileᵀ.

    The kernel of every dequant_<format> variant (``fmt`` their format).

    Per K block: TMA brings A (block_M, block_K) bf16, the packed weight (block_N, block_K/2) and
    the group scales (and zeros) into shared memory (warp-specialized pipeline); every consumer
    thread decodes its fragment with the CUDA decoder; ``wgmma_rs`` multiplies and waits. The fp32
    tile is transposed into shared memory as bf16 and stored to C (M, N); TMA zero-fills A rows
    and clips C rows past M.
    """
    check_gemm_shape("dequant_w4_kernel", M, N, K)
    import tilelang.language as T
    from tilelang.layout import make_linear_layout

    check_tile(fmt, K, tile)
    bM, bN, bK, G = tile.block_M, tile.block_N, tile.block_K, fmt.group
    groups_per_block = max(bK // G, 1)
    scale_dtype = "uint8" if fmt.scale == "e8m0" else "bfloat16"
    swizzle = swizzled_packed_tile(tile)
    decoder = f"dq_decode_fragment<{fmt.kind}, {bK}, {G}, {bN}, {int(swizzle)}>"
    zeros_shape = (K // G, N) if fmt.has_zeros else (1,)

    @T.prim_func
    def main(
        A: T.Tensor((M, K), "bfloat16"),
        B: T.Tensor((N, K // 2), "int8"),
        S: T.Tensor((K // G, N), scale_dtype),
        Z: T.Tensor(zeros_shape, "bfloat16"),
        C: T.Tensor((M, N), "bfloat16"),
    ):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=tile.threads) as (bx, by):
            A_shared = T.alloc_shared((bM, bK), "bfloat16")
            B_shared = T.alloc_shared((bN, bK // 2), "int8")
            S_shared = T.alloc_shared((groups_per_block, bN), scale_dtype)
            W_frag = T.alloc_fragment((bN, bK), "bfloat16")
            Ct_frag = T.alloc_fragment((bN, bM), "float32")
            C_shared = T.alloc_shared((bM, bN), "bfloat16")
            tx = T.get_thread_binding()
            T.import_source(DECODE_CUDA_SOURCE)
            # The decoder writes the fragment and reads the shared tiles through raw pointers, so
            # their layouts are pinned here: the fragment to wgmma's A layout (layout inference
            # rejects the kernel if T.gemm wanted another), the shared tiles to row-major.
            layouts = {
                W_frag: T.Fragment((bN, bK), forward_thread_fn=fragment_thread, forward_index_fn=fragment_index),
                B_shared: packed_layout(bN, bK) if swizzle else make_linear_layout(B_shared),
                S_shared: make_linear_layout(S_shared),
            }
            if fmt.has_zeros:
                Z_shared = T.alloc_shared((groups_per_block, bN), "bfloat16")
                layouts[Z_shared] = make_linear_layout(Z_shared)
            T.annotate_layout(layouts)
            if tile.swizzle:
                T.use_swizzle(tile.swizzle)
            T.clear(Ct_frag)
            for k in T.Pipelined(K // bK, num_stages=tile.num_stages):
                T.copy(A[by * bM, k * bK], A_shared)
                T.copy(B[bx * bN, k * (bK // 2)], B_shared)
                T.copy(S[k * bK // G, bx * bN], S_shared)
                if fmt.has_zeros:
                    T.copy(Z[k * bK // G, bx * bN], Z_shared)
                # without zero points the decoder's zeros pointer is an unread stand-in (S_shared); no
                # alias variable: TileLang would name the buffer after it in the generated source
                T.call_extern("handle", decoder, T.address_of(W_frag[0, 0]), T.address_of(B_shared[0, 0]),
                              T.address_of(S_shared[0, 0]),
                              T.address_of((Z_shared if fmt.has_zeros else S_shared)[0, 0]), tx)
                T.gemm(W_frag, A_shared, Ct_frag, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(bN, bM):
                C_shared[j, i] = Ct_frag[i, j]
            T.copy(C_shared, C[by * bM, bx * bN])

    return main


def prepare_dequant_w4(ops: Operands, fmt: W4Format) -> Operands:
    """The prepare of every dequant_<format> variant."""
    if fmt.has_zeros:
        return {}
    # the kernel signature is the same for every format; an unread one-element dummy stands in for
    # the zeros, made once with the operands
    return {"zeros": torch.empty(1, dtype=torch.bfloat16, device=ops["A"].device)}


def launch_dequant_w4(kernel, ops: Operands, fmt: W4Format) -> torch.Tensor:
    """The launch of every dequant_<format> variant."""
    return kernel(ops["A"], ops["B"], ops["scales"], ops["zeros"])


def launch_torch_dequant_matmul_w4(kernel, ops: Operands, fmt: W4Format) -> torch.Tensor:
    """Torch ops decode the whole weight to bf16, then cuBLAS multiplies: the launch of every
    torch_dequant_matmul_<format> variant."""
    return torch.matmul(ops["A"], decode_weight_bf16(ops, fmt).T)


# sm_90a: bf16 wgmma with A from registers (the decoded weight fragment). sm_89 and sm_100a build the
# same kernel with bf16 mma.sync (the per-warp A fragment layout is the same); not tuned there.
WGMMA_RS_BF16 = r"wgmma_rs<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32"
MMA_SYNC_BF16 = r"mma_sync<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32"
# ... and in the SASS (wgmma_rs and wgmma_ss share the opcode; k is 16 for bf16)
HGMMA_BF16 = r"HGMMA\.64x\d+x16\.F32\.BF16"
HMMA_BF16 = r"HMMA\.16816\.F32\.BF16"


def _register(tilelang_name: str, torch_name: str, fmt: W4Format) -> W4Format:
    """Register the format's (kernels.dequant_formats) torch decode-then-matmul variant and TileLang kernel variant."""
    emulate = partial(emulate_dequant_w4, fmt=fmt)
    register_variant(Variant(
        name=torch_name, family="dequant", input_format=fmt.name, emulate=emulate,
        launch=partial(launch_torch_dequant_matmul_w4, fmt=fmt), baseline=CUBLAS_BF16.name,
        description=f"torch ops decode the {fmt.name} weight to bf16 (bf16_rn(value·scale)), then torch.matmul",
    ))
    register_variant(Variant(
        name=tilelang_name, family="dequant", input_format=fmt.name, emulate=emulate,
        launch=partial(launch_dequant_w4, fmt=fmt), prepare=partial(prepare_dequant_w4, fmt=fmt),
        kernel=partial(dequant_w4_kernel, fmt=fmt), out_idx=(4,), pass_configs={"sm_90a": dequant_pass_configs},
        # bf16 wgmma accumulates in full fp32 like cuBLAS's bf16 GEMM: the unquantized GEMM is the
        # matched peer; torch's own W4A16 kernel (tinygemm, on its own int4 format) is the second column
        baseline=CUBLAS_BF16.name, second_baseline=TINYGEMM.name,
        instructions={"sm_90a": WGMMA_RS_BF16, "sm_89": MMA_SYNC_BF16, "sm_100a": MMA_SYNC_BF16},
        sass={"sm_90a": HGMMA_BF16, "sm_89": HMMA_BF16, "sm_100a": HMMA_BF16},
        description=f"TileLang W4A16 ({fmt.name}): packed weight decoded in registers straight into the "
        "wgmma_rs A operand (Cᵀ = Ŵ·Aᵀ), bf16_rn(value·scale), fp32 accumulation, bf16 out",
    ))
    return fmt


# ---------------------------------------------------------------------------------------------
# tinygemm: torch's own W4A16 kernel (``torch._weight_int4pack_mm``, bf16 only), the library peer of
# the family, on its own format ``w4_tinygemm_g128`` (kernels.dequant_formats: uint4 codes with a bf16
# scale and a bf16 value zero per 128 K). The layout change to tinygemm's tiles runs on the GPU in
# ``prepare``, untimed.
TINYGEMM_INNER_K_TILES = 8  # K tiles of 16 per packed row chunk (2, 4 or 8); 8 is torchao's default


def emulate_tinygemm(ops: Operands) -> torch.Tensor:
    """tinygemm's arithmetic on the CPU: bf16 weights bf16_rn((q - 8)·s + z) (one fma), fp32 accumulation,
    one bf16 rounding of the output (checked against torch's CPU ``_weight_int4pack_mm_for_cpu`` in the tests)."""
    A = format_operands(ops, ("A",), "emulate_tinygemm")[0]
    return (A.float() @ tinygemm_weight(ops, "emulate_tinygemm").to(torch.bfloat16).float().T).to(torch.bfloat16)


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


TINYGEMM = register_variant(Variant(
    name="tinygemm_w4_g128", family="dequant", input_format=TINYGEMM_FORMAT, emulate=emulate_tinygemm,
    launch=launch_tinygemm, prepare=prepare_tinygemm, baseline=CUBLAS_BF16.name, min_cc=80,
    shape_limit=tinygemm_shape_limit,
    description="torch._weight_int4pack_mm (tinygemm): torch's W4A16 kernel, int4 g128 with scale and zero, bf16",
))


# each format (kernels.dequant_formats, registered there) with its two variants
_register("dequant_w4_int4_sym_g128", "torch_dequant_matmul_w4_int4_sym_g128", W4_INT4_SYM_G128)
_register("dequant_w4_uint4_zp_g128", "torch_dequant_matmul_w4_uint4_zp_g128", W4_UINT4_ZP_G128)
_register("dequant_w4_e2m1_g32", "torch_dequant_matmul_w4_e2m1_g32", W4_E2M1_G32)
_register("dequant_w4_mxfp4", "torch_dequant_matmul_w4_mxfp4", W4_MXFP4)
