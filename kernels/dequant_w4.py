"""dequant_w4: the W4A16 GEMM of every dequant_w4_<format> variant, C (M,N) = A · Ŵᵀ, A bf16 (M,K),
W 4-bit (N,K) packed two codes per byte along K with group scales (formats: ``kernels.dequant_formats``).

The weight-as-left-operand form Cᵀ = Ŵ · Aᵀ, sm_90a: each consumer warpgroup owns 64 weight rows; it
decodes its packed bytes from shared memory straight into the register fragment of ``wgmma``'s A operand
(``wgmma_rs``), while the activation tile (block_M rows, zero-filled past M by TMA) is the B operand from
shared memory. So block_M is the wgmma N (16 for decode, 256 for prefill) and the weights are never
written back to shared memory in bf16. Decode order (the emulation, ``kernels.dequant``, mirrors it):
code -> exact small value v (bf16), then one ``fma.rn.bf16x2`` v·scale + (-0): Ŵ = bf16_rn(v · scale), a
single rounding of the exact product; int4 values are made exact with the 0x4300 magic number, e2m1
values by bit placement (the 3 magnitude bits at bf16 bits 6-8 are exactly value·2^-126, one exact fma by
2^126 restores it; code 0 -> +0.0). The untimed prepare arranges the packed weight once
(``arrange_packed``): in panels of 64 rows, each panel's K in 32-byte spans of 64 rows (span-major), so that
the K block one CTA loads is one contiguous piece of memory whatever block_K is, and a warp's decode loads read
256 contiguous bytes of shared memory (no bank conflict, no swizzle); within a span a decoding thread's 8 pairs
are 8 contiguous bytes (one 8-byte shared load), for the int4 decodes with each pair's two codes 16 bits apart
(a shift and one LOP3 place both in their bf16 lanes, no byte permute).
The decoder is CUDA, ``dequant_w4_decode.cuh`` beside this module. Accumulation is fp32 in wgmma, the
output is rounded to bf16 once. The same
prim_func builds for sm_89 and sm_100a with bf16 ``mma.sync`` (untuned there). In the two pipelined forms the
wgmma waits at every K block (``T.gemm``): TileLang's pipeline frees a stage's shared buffers right after their
last use in program order, before a later ``T.wait_wgmma``, so an asynchronous wgmma would race the refill of
its activation tile.

Three forms, chosen by the tile (``dequant_w4_pass_configs``). A tile with a producer warpgroup beside its
consumers (threads 128·(block_N/64 + 1), ``overlapped_form``) builds ``dequant_w4_overlapped_kernel``: its own
ring and barriers, the decode of K block k + 1 under the wgmma of block k. Otherwise decode tiles (block_M <= 64)
are built without TileLang's warp specialization, so every thread loads (cp.async), decodes and multiplies in
64-221 registers and several CTAs share an SM. A decode tile may split K (``_split<n>``): the n CTAs of one
output tile form a thread-block cluster along the grid's z, each runs 1/n of the K blocks (the last
K/block_K mod n CTAs one more), and rank 0 adds the others' fp32 sums through distributed shared memory in
rank order (``dq_cluster_reduce``: deterministic, one kernel, no workspace), so a narrow N still fills the SMs.
Prefill tiles keep TileLang's producer warpgroup and TMA loads. docs/design/dequant_w4.md has the measurements.

Tiles: ``m{rows of A}n{weight rows = 64 per consumer warpgroup}k{K block}_s{stages}_t{128·n/64, or 128·(n/64 + 1)
with a producer}_wrow[_split{n}]``;
the warps must lie along the weight rows (``_wrow``). block_K must be a multiple or a divisor of the
group, K a multiple of block_K (at least n K blocks; a split whose n does not divide them gives its last CTAs
one block more), and N a multiple of 64 (the weight's panels). TileLang evaluates a prim_func's
annotations with the factory's closure variables, so this module must not use
``from __future__ import annotations``.
"""
import math
from pathlib import Path
from typing import NamedTuple

import torch

from kernels.dequant_formats import W4Format
from kernels.formats import check_gemm_shape
from kernels.registry import Operands
from kernels.tile_space import TileSpace
from kernels.tiles import MAX_REGISTERS_PER_THREAD, REGISTERS_PER_BLOCK, STATIC_SMEM_RESERVE, Tile
from kernels.warp_specialized import PASS_CONFIGS as WS_PASS_CONFIGS
from kernels.warp_specialized import TMA_PRODUCER, WARPGROUP, Launch, Skeleton, has_producer

# The CUDA decoder, pasted into the kernel with T.import_source and called with T.call_extern. It also
# compiles as host C++ (tests/test_dequant.py runs it on the CPU): the two device instructions it needs,
# prmt and fma.rn.bf16x2, have host stand-ins; a host build must define dq_host_fma_bf16x2 first.
DECODE_CUDA_FILE = Path(__file__).with_name("dequant_w4_decode.cuh")
# after a newline, as the generated CUDA held by hash (tests/test_generated_cuda.py) has it
DECODE_CUDA_SOURCE = "\n" + DECODE_CUDA_FILE.read_text()


def fragment_thread(i, j):
    """Thread owning element (i, j) of the decoded weight fragment (wgmma A operand, 64 rows per warpgroup)."""
    return i // 16 * 32 + i % 8 * 4 + j % 8 // 2


def consumer_fragment_thread(wg: int):
    """``fragment_thread`` for consumer warpgroup ``wg`` of a kernel whose warpgroup 0 is the producer."""
    return lambda i, j: fragment_thread(i, j) + WARPGROUP * (wg + 1)


def fragment_index(i, j):
    """Register slot of element (i, j) in its thread's fragment (bf16 units)."""
    return j // 8 * 4 + i % 16 // 8 * 2 + j % 2


def check_dequant_w4_tile(fmt: W4Format, K: int, tile: Tile) -> None:
    """Raise ValueError when the tile does not fit the weight-as-left-operand kernel."""
    bM, bN, bK = tile.block_M, tile.block_N, tile.block_K
    problems = []
    if tile.policy != "FullRow":
        problems.append("the warps must lie along the weight rows: use a _wrow tile")
    consumers = max(bN // PANEL_ROWS, 1)
    if bN % 64 or tile.threads not in (WARPGROUP * consumers, WARPGROUP * (consumers + 1)):
        problems.append(f"block_N (weight rows) must be 64 per consumer warpgroup: threads = 128·block_N/64 "
                        f"= {WARPGROUP * consumers}, or {WARPGROUP * (consumers + 1)} with a producer warpgroup "
                        f"(the overlapped form), got block_N={bN}, threads={tile.threads}")
    if overlapped_form(tile) and bN > OVERLAPPED_MAX_BLOCK_N:
        problems.append(f"the overlapped form runs one or two consumer warpgroups: block_N at most "
                        f"{OVERLAPPED_MAX_BLOCK_N}, got {bN}")
    if bM % 8 or not 8 <= bM <= 256:
        problems.append(f"block_M (rows of A, the wgmma N) must be a multiple of 8 in [8, 256], got {bM}")
    if bK % 64 or bK > 512:
        problems.append(f"block_K must be a multiple of 64 (arranged rows are read in 32-byte spans) and at most "
                        f"512, got {bK}")
    if bK % fmt.group and fmt.group % bK:
        problems.append(f"block_K={bK} and the group size {fmt.group} must divide one another")
    if K % bK or K // bK < tile.split_k:
        problems.append(f"K={K} must be a multiple of block_K={bK} with at least one K block per CTA of the "
                        f"split ({tile.split_k})")
    if tile.split_k > 1 and not (decode_form(tile) or overlapped_form(tile)):
        problems.append(f"a K split needs the decode form (block_M <= {DECODE_MAX_BLOCK_M}) or the overlapped form "
                        f"(a producer warpgroup), got block_M={bM} with threads={tile.threads}")
    if not 1 <= tile.split_k <= MAX_SPLIT_K:
        problems.append(f"the K split is a thread-block cluster of at most {MAX_SPLIT_K} CTAs, got {tile.split_k}")
    if tile.split_k > 1 and tile.swizzle:
        # TileLang 0.1.15's codegen: "Only support annotate threadblock swizzle for cluster on X dimension"
        problems.append(f"a K split (a cluster along the grid's z) takes no raster swizzle (TileLang swizzles only "
                        f"clusters along x), got _z{tile.swizzle} with split {tile.split_k}")
    if problems:
        raise ValueError(f"tile {tile.name} does not fit {fmt.name}: " + "; ".join(problems))


# Decode tiles (block_M <= 64 rows of A) are built without TileLang's warp specialization: with it the
# one consumer warpgroup gets setmaxnreg 240, so a CTA (plus its producer warpgroup) takes a whole SM's
# registers and one CTA runs per SM with nothing to hide its latency. Without it every thread loads,
# decodes and multiplies in what it needs (124 registers at block_K 256: four CTAs per SM; 219-251 at
# 512: two). On the H200 (docs/design/dequant_w4.md) 16x28672x8192 went from 117 to 67 µs; prefill
# tiles keep it: without it 4096x8192x8192 took 1234 µs, not 784.
DECODE_MAX_BLOCK_M = 64
# The overlapped form's consumer warpgroups: one or two (kernels.warp_specialized's register budgets)
OVERLAPPED_MAX_BLOCK_N = 128
# The overlapped form's smallest block_M the tile space offers: at M <= 32 the decode form's best was 13-17 % faster
# in every try, at 64 the overlapped form 1.25x faster (docs/design/dequant_w4.md, round 13)
OVERLAPPED_MIN_BLOCK_M = 64
# A K split (``_split<n>``) is one thread-block cluster along the grid's z: the portable cluster size
MAX_SPLIT_K = 8
# The prepared weight's panels (``arrange_packed``): 64 rows (one consumer warpgroup's) by spans of 32 bytes
PANEL_ROWS = 64
PANEL_SPAN_BYTES = 32


def panel_problem(N: int) -> str | None:
    """Why a weight of N rows cannot be prepared in panels (``arrange_packed``), or None."""
    return f"N={N} must be a multiple of {PANEL_ROWS}: the packed weight is stored in panels of {PANEL_ROWS} rows" \
        if N % PANEL_ROWS else None


def overlapped_form(tile: Tile) -> bool:
    """Whether ``tile`` builds the overlapped form: a producer warpgroup beside one consumer warpgroup per 64
    weight rows, threads = 128·(block_N/64 + 1) (the other forms have 128·block_N/64)."""
    return has_producer(tile.threads, tile.block_N)


def decode_form(tile: Tile) -> bool:
    """Whether ``tile`` builds the decode form (block_M <= 64, no producer warpgroup) rather than the overlapped
    form or TileLang's warp-specialized prefill form."""
    return tile.block_M <= DECODE_MAX_BLOCK_M and not overlapped_form(tile)


def dequant_w4_pass_configs(tile: Tile) -> dict:
    """The sm_90a pass configs of a dequant_w4_<format> tile: the decode form, the overlapped form (its own
    producer and barriers) or the prefill form (TileLang's warp specialization)."""
    if overlapped_form(tile):
        return dict(WS_PASS_CONFIGS)
    return {"tl.disable_warp_specialized": True} if decode_form(tile) else {}


# What one sm_90 SM holds for resident CTAs: 228 KiB of shared memory (1 KiB of it reserved per CTA),
# 64 K registers and 64 warps (CUDA's occupancy rules)
SM90_SHARED_BYTES_PER_SM = 228 * 1024
SM90_SHARED_RESERVED_PER_CTA = 1024
SM90_WARPS_PER_SM = 64


def decode_form_registers(tile: Tile) -> int:
    """Registers a decode-form thread holds, estimated before compiling: its K block's decoded weights (64 rows
    x block_K bf16 over 128 threads: block_K/4, plus its scales and addresses), its fp32 sums and their
    transposed store (about 0.9 per row of A), and about 24 more. Fitted to ptxas on the panel-arranged
    kernel (compile-only, 2026-12-07, 64 x 8192 x 8192): 64-221 registers over block_M 8-64 and block_K 128-512,
    within 8 of it for 8 of 12 tiles, 13-26 under at m16n64k256, m16n64k512 and m32n64k512, 16 over at
    m64n64k256; ptxas's count is not monotonic in the block sizes."""
    return math.ceil(24 + 0.27 * tile.block_K + 0.9 * tile.block_M)


def dequant_w4_ctas_per_sm(tile: Tile, smem_bytes: int, registers: int | None = None) -> int:
    """CTAs of ``tile`` one sm_90 SM holds at once. A decode tile's as many as its registers per thread
    (``registers``, default the estimate ``decode_form_registers``; allocated in steps of 8), its shared memory
    (``smem_bytes`` plus the static reserve) and its warps allow; a prefill tile's warp-specialized consumers
    raise their registers to fill the SM (setmaxnreg): one."""
    if not decode_form(tile):
        return 1  # the overlapped and prefill forms' consumers raise their registers to fill the SM (setmaxnreg)
    registers = -(-min(registers or decode_form_registers(tile), MAX_REGISTERS_PER_THREAD) // 8) * 8
    by_registers = REGISTERS_PER_BLOCK // (registers * tile.threads)
    per_cta = smem_bytes + STATIC_SMEM_RESERVE["sm_90a"] + SM90_SHARED_RESERVED_PER_CTA
    return max(1, min(by_registers, SM90_SHARED_BYTES_PER_SM // per_cta, SM90_WARPS_PER_SM // (tile.threads // 32)))


def dequant_w4_tile_rule(fmt: W4Format, M: int, N: int, K: int, tile: Tile) -> str | None:
    """Why the tile space leaves ``tile`` out at M x N x K (None: a candidate): the kernel's own rule
    (``check_dequant_w4_tile``: K in whole K blocks, the group; N in whole panels of 64 rows), and the forms
    measured slower (docs/design/dequant_w4.md): a decode tile of two warpgroups (block_N 128: 28.6 against 19.7 µs at
    1x8192²) or of K blocks under 128, a prefill tile of K blocks over 128 (its decoded fragment and the
    producer's ring outgrow the registers and shared memory one CTA per SM has), an overlapped tile of block_M under
    64 or of K blocks its registers or TileLang do not take. A decode tile over more than
    8 row blocks of A (decoding each weight 9 times or more) is left out with the raster swizzle it would get."""
    try:
        check_dequant_w4_tile(fmt, K, tile)
    except ValueError as e:
        return str(e)
    if why := panel_problem(N):
        return f"tile {tile.name}: {why}"
    if overlapped_form(tile):
        if tile.block_K > 256 or tile.block_N > 64 and tile.block_K > 128:
            # two fragments of 512 outgrow the registers (ptxas C7512 serializes the wgmmas); two consumers of 256
            # stop TileLang ("scalable vector")
            return f"tile {tile.name}: the overlapped form runs K blocks of at most 256 (128 with two consumers)"
        if tile.block_M < OVERLAPPED_MIN_BLOCK_M:
            return (f"tile {tile.name}: the overlapped form takes block_M of at least {OVERLAPPED_MIN_BLOCK_M} "
                    f"(below, the decode form's several CTAs per SM ran 13-17 % faster)")
    if decode_form(tile) and (tile.block_N != 64 or tile.block_K < 128 or tile.swizzle):
        return (f"tile {tile.name}: the decode form runs one warpgroup (block_N 64) on K blocks of at least 128, "
                f"in a plain raster (at most 8 row blocks)")
    if not decode_form(tile) and tile.block_K > 128:
        return f"tile {tile.name}: the prefill form runs K blocks of at most 128"
    return None


def dequant_w4_tile_space(fmt: W4Format) -> TileSpace:
    """The tiles the selection ranks for ``fmt``'s kernel on sm_90a: the decode form (block_M 8-64, K
    blocks of 128-512, K split over 1-8 CTAs, several CTAs per SM), the warp-specialized prefill form
    (block_M 128-256, one or two consumer warpgroups) and the overlapped form (a producer warpgroup beside one or
    two consumers, block_M 64-256, K split over 1-8 CTAs; ``overlaps`` tells the model); every ring depth 2-4 that
    keeps the most CTAs on an SM (``dequant_w4_ctas_per_sm``)."""
    return TileSpace(block_M=(8, 16, 32, 64, 128, 256), block_N=(64, 128), block_K=(64, 128, 256, 512),
                     threads=lambda block_M: (128, 256, 384), max_stages=4, min_stages=2, policies=("FullRow",),
                     swizzle=lambda m_blocks, n_blocks: 8 if m_blocks > 8 else 0, split_k=(1, 2, 4, 8),
                     rule=lambda M, N, K, tile: dequant_w4_tile_rule(fmt, M, N, K, tile),
                     ctas_per_sm=dequant_w4_ctas_per_sm, overlaps=overlapped_form, arches=("sm_90a",))


class KernelPlan(NamedTuple):
    """What both forms' factories derive from (M, N, K, tile, format)."""

    groups_per_block: int  # the group scale rows one K block reads
    scale_dtype: str
    zeros_shape: tuple  # an unread one-element stand-in for a format without zero points
    decoder: str  # the CUDA decoder's instantiation
    k_blocks: int  # K blocks per CTA of a split, before the last K/bK mod split CTAs' one more
    longer: int  # how many CTAs of a split run one K block more
    grid: tuple  # a split kernel's grid gains a z axis, one cluster of ``split`` CTAs per output tile
    cluster: dict
    reduce: str  # the cluster reduction's instantiation (fp32 sums per consumer thread, consumer threads)


def kernel_plan(M: int, N: int, K: int, tile: Tile, fmt: W4Format) -> KernelPlan:
    bM, bN, bK, split = tile.block_M, tile.block_N, tile.block_K, tile.split_k
    consumer_threads = WARPGROUP * (bN // PANEL_ROWS)
    return KernelPlan(
        groups_per_block=max(bK // fmt.group, 1),
        scale_dtype="uint8" if fmt.scale == "e8m0" else "bfloat16",
        zeros_shape=(K // fmt.group, N) if fmt.has_zeros else (1,),
        decoder=f"dq_decode_fragment<{fmt.kind}, {bK}, {fmt.group}, {bN}, {packed_arrangement(fmt)}>",
        k_blocks=K // bK // split, longer=K // bK % split,
        grid=(-(-N // bN), -(-M // bM)) + ((split,) if split > 1 else ()),
        cluster={"cluster_dims": (1, 1, split)} if split > 1 else {},
        reduce=f"dq_cluster_reduce<{bN * bM // consumer_threads}, {consumer_threads}>")


def dequant_w4_kernel(M: int, N: int, K: int, tile: Tile, fmt: W4Format):
    """TileLang W4A16 GEMM, weight-as-left-operand: Cᵀ tile (block_N x block_M) = Ŵ tile · A tileᵀ.

    The kernel of every dequant_w4_<format> variant (``fmt`` their format).

    Per K block: TMA brings A (block_M, block_K) bf16, the packed weight (block_N/64 panels of block_K/64
    spans of 64 rows x 32 bytes) and
    the group scales (and zeros) into shared memory (warp-specialized pipeline); every consumer
    thread decodes its fragment with the CUDA decoder; ``wgmma_rs`` multiplies and waits. The fp32
    tile is transposed into shared memory as bf16 and stored to C (M, N); TMA zero-fills A rows
    and clips C rows past M.
    """
    check_gemm_shape("dequant_w4_kernel", M, N, K)
    import tilelang.language as T
    from tilelang.layout import make_linear_layout

    check_dequant_w4_tile(fmt, K, tile)
    if why := panel_problem(N):
        raise ValueError(f"dequant_w4_kernel: {why}")
    if overlapped_form(tile):
        return dequant_w4_overlapped_kernel(M, N, K, tile, fmt)
    bM, bN, bK, G = tile.block_M, tile.block_N, tile.block_K, fmt.group
    groups_per_block, scale_dtype, zeros_shape, decoder, k_blocks, longer, grid, launch, reduce = \
        kernel_plan(M, N, K, tile, fmt)
    panels = bN // PANEL_ROWS
    split = tile.split_k
    # K blocks per CTA: a split's last K/bK mod split CTAs take one more (uneven, so a K of 74 blocks splits 4 ways).
    # TileLang's pipeline needs a static trip count: every CTA runs the longer count, a shorter one loading the
    # next CTA's first block (in bounds, shared through L2) and skipping its decode and wgmma
    first_longer = split - longer

    @T.macro
    def store_tile(Ct_frag, C_shared, C, bx, by):
        for i, j in T.Parallel(bN, bM):
            C_shared[j, i] = Ct_frag[i, j]
        T.copy(C_shared, C[by * bM, bx * bN])

    @T.macro
    def decode_and_multiply(W_frag, B_shared, S_shared, zeros, Ct_frag, A_shared, tx):
        T.call_extern("handle", decoder, T.address_of(W_frag[0, 0]), T.address_of(B_shared[0, 0, 0]),
                      T.address_of(S_shared[0, 0]), T.address_of(zeros[0, 0]), tx)
        T.gemm(W_frag, A_shared, Ct_frag, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

    @T.prim_func
    def main(
        A: T.Tensor((M, K), "bfloat16"),
        B: T.Tensor((N // PANEL_ROWS, K, PANEL_SPAN_BYTES), "int8"),
        S: T.Tensor((K // G, N), scale_dtype),
        Z: T.Tensor(zeros_shape, "bfloat16"),
        C: T.Tensor((M, N), "bfloat16"),
    ):
        with T.Kernel(*grid, threads=tile.threads, **launch) as block:
            bx, by = block[0], block[1]
            k_first = block[2] * k_blocks + T.max(block[2] - first_longer, 0) if split > 1 else 0
            A_shared = T.alloc_shared((bM, bK), "bfloat16")
            B_shared = T.alloc_shared((panels, bK, PANEL_SPAN_BYTES), "int8")
            S_shared = T.alloc_shared((groups_per_block, bN), scale_dtype)
            W_frag = T.alloc_fragment((bN, bK), "bfloat16")
            Ct_frag = T.alloc_fragment((bN, bM), "float32")
            C_shared = T.alloc_shared((bM, bN), "bfloat16")
            if split > 1:
                partial_sums = T.alloc_shared((bN * bM,), "float32")
                leader = T.alloc_local((1,), "int32")
            tx = T.get_thread_binding()
            T.import_source(DECODE_CUDA_SOURCE)
            # The decoder writes the fragment and reads the shared tiles through raw pointers, so
            # their layouts are pinned here: the fragment to wgmma's A layout (layout inference
            # rejects the kernel if T.gemm wanted another), the shared tiles to row-major.
            layouts = {
                W_frag: T.Fragment((bN, bK), forward_thread_fn=fragment_thread, forward_index_fn=fragment_index),
                B_shared: make_linear_layout(B_shared),
                S_shared: make_linear_layout(S_shared),
            }
            if fmt.has_zeros:
                Z_shared = T.alloc_shared((groups_per_block, bN), "bfloat16")
                layouts[Z_shared] = make_linear_layout(Z_shared)
            if split > 1:
                # the cluster reduction reads the sums through a raw pointer too: wgmma's accumulator (D)
                # layout, which maps elements to threads and slots as the A fragment does
                layouts[Ct_frag] = T.Fragment((bN, bM), forward_thread_fn=fragment_thread,
                                              forward_index_fn=fragment_index)
            T.annotate_layout(layouts)
            if tile.swizzle:
                T.use_swizzle(tile.swizzle)
            T.clear(Ct_frag)
            for kb in T.Pipelined(k_blocks + (1 if longer else 0), num_stages=tile.num_stages):
                k = k_first + kb
                T.copy(A[by * bM, k * bK], A_shared)
                T.copy(B[bx * panels, k * bK, 0], B_shared)  # one contiguous piece per panel
                T.copy(S[k * bK // G, bx * bN], S_shared)
                if fmt.has_zeros:
                    T.copy(Z[k * bK // G, bx * bN], Z_shared)
                # without zero points the decoder's zeros pointer is an unread stand-in (S_shared); no
                # alias variable: TileLang would name the buffer after it in the generated source
                if longer:
                    # a shorter CTA's last iteration loaded the next CTA's block: not its own to add
                    if kb < k_blocks or block[2] >= first_longer:
                        decode_and_multiply(W_frag, B_shared, S_shared, Z_shared if fmt.has_zeros else S_shared,
                                            Ct_frag, A_shared, tx)
                else:
                    decode_and_multiply(W_frag, B_shared, S_shared, Z_shared if fmt.has_zeros else S_shared,
                                        Ct_frag, A_shared, tx)
            if split > 1:
                # the cluster's partial sums meet in rank 0 (dq_cluster_reduce), which stores the tile
                leader[0] = T.call_extern("int32", reduce, T.address_of(Ct_frag[0, 0]),
                                          T.address_of(partial_sums[0]), tx)
                if leader[0] == 1:
                    store_tile(Ct_frag, C_shared, C, bx, by)
            else:
                store_tile(Ct_frag, C_shared, C, bx, by)

    return main


def dequant_w4_overlapped_kernel(M: int, N: int, K: int, tile: Tile, fmt: W4Format):
    """The overlapped form of ``dequant_w4_kernel`` (a tile with a producer warpgroup, ``overlapped_form``): the
    decode of K block k + 1 runs while the wgmma of block k does.

    - producer warpgroup, warp 0: TMA-loads each K block of the CTA's range (its A rows, the weight's panels, the
      group scales and zeros) into a ring of ``num_stages`` stages, guarded by *full* (the bytes landed) and
      *empty* (every consumer warp's wgmma reading the stage retired) barriers;
    - one or two consumer warpgroups, 64 weight rows each: wait for the stage, decode their rows into one of
      two register fragments in turn (even and odd K blocks), issue the register-sourced wgmma (activations
      from the stage) without waiting, then ``wait_wgmma(1)``: the previous block's wgmma retires and its
      stage is released, this block's keeps running while the next block is decoded.

    So no consumer waits for its own wgmma inside the K loop, and the activation tile stays in its stage until
    the wgmma that reads it retired (the reason the pipelined forms wait at every K block). One output tile per
    CTA (grid as the decode form's); a K split is a cluster along z whose rank 0 adds the partial sums
    (``dq_cluster_reduce``, the producer warpgroup joining its two cluster barriers). The epilogue transposes the
    fp32 sums into a bf16 (block_M, 64) tile per consumer and TMA-stores it (rows past M clipped).
    """
    import tilelang.language as T
    from tilelang.layout import make_linear_layout

    bM, bN, bK, G, S = tile.block_M, tile.block_N, tile.block_K, fmt.group, tile.num_stages
    consumers = panels = bN // PANEL_ROWS  # a consumer warpgroup per panel of 64 weight rows
    groups_per_block, scale_dtype, zeros_shape, decoder, k_blocks, longer, grid, cluster, reduce = \
        kernel_plan(M, N, K, tile, fmt)
    split = tile.split_k
    first_longer = split - longer  # as the decode form: the last K/bK mod split CTAs run one block more
    count = k_blocks + (1 if longer else 0)  # the K blocks every CTA runs (see k_first below)
    # the skeleton's roles and epilogue (its launch fields other than the consumers are unused: one tile per CTA)
    shape = Launch(consumers, tile.threads, 1, 1, k_blocks, 1, 1, 1)
    ws = Skeleton(T, tile, shape, TMA_PRODUCER, S)
    rows = PANEL_ROWS

    @T.macro
    def step(g, first, F, A_s, B_s, S_s, Z_s, full, empty, acc, tid, lane, last=False):
        slot = g % S
        T.barrier_wait(full[slot], (g // S) & 1)
        T.call_extern("handle", decoder, T.address_of(F[0, 0]), T.address_of(B_s[slot, 0, 0, 0]),
                      T.address_of(S_s[slot, 0, 0]), T.address_of((Z_s if fmt.has_zeros else S_s)[slot, 0, 0]), tid)
        T.wgmma_gemm(F, A_s[slot, :, :], acc, transpose_B=True, policy=T.GemmWarpPolicy.FullRow, clear_accum=first)
        # block g - 1's wgmma retires (block g's keeps running); its stage is free. The wait is unconditional: behind
        # a branch (g > 0) ptxas serializes every wgmma (C7514). The last block waits for its own wgmma right here:
        # with that wait after the loop, ptxas (CUDA 13.0) scheduled the epilogue's reads of the sums above it
        # whenever registers allowed, losing part of the last block (the SASS check of
        # test_compile_overlapped_form_keeps_its_wgmmas_in_flight)
        T.wait_wgmma(0 if last else 1)
        if g > 0:
            if lane == 0:
                T.barrier_arrive(empty[(g + S - 1) % S])

    @T.macro
    def stage_output(acc, C_s, C, by, col, wg):
        for i, j in T.Parallel(rows, bM):
            C_s[j, i] = acc[i, j]

    @T.macro
    def store_output(acc, C_s, C, by, col, wg):
        T.tma_copy(C_s, C[by * bM:(by + 1) * bM, col:col + rows])

    @T.macro
    def consume(A_s, B_s, S_s, Z_s, full, empty, partial_sums, C, C_s, acc, F0, F1, wg):
        tx = T.get_thread_binding()
        tid = tx - WARPGROUP  # among the consumer threads: the decoder's rows (64 per warpgroup)
        lane = tx % 32
        # the fragments alternate, in pairs of blocks: an odd count's first block goes before the loop (after it,
        # ptxas would see its fragment redefined under the last wgmma and serialize them all, C7513), the last pair
        # after it (its second block waits for all)
        odd = count % 2
        if odd:
            step(0, True, F0, A_s, B_s, S_s, Z_s, full, empty, acc, tid, lane, last=count == 1)
        if count // 2 > 1:
            for kp in T.serial(count // 2 - 1):
                step(odd + 2 * kp, not odd and kp == 0, F1 if odd else F0, A_s, B_s, S_s, Z_s, full, empty, acc, tid,
                     lane)
                step(odd + 2 * kp + 1, False, F0 if odd else F1, A_s, B_s, S_s, Z_s, full, empty, acc, tid, lane)
        if count > 1:
            step(count - 2, count == 2, F1 if odd else F0, A_s, B_s, S_s, Z_s, full, empty, acc, tid, lane)
            step(count - 1, False, F0 if odd else F1, A_s, B_s, S_s, Z_s, full, empty, acc, tid, lane, last=True)
        T.warpgroup_fence_operand(acc, num_regs=rows * bM // WARPGROUP)
        bx, by = T.get_block_binding(0), T.get_block_binding(1)
        col = bx * bN + wg * rows
        if split > 1:
            # rank 0 of the cluster (the call returns 1 there) adds the others' sums and stores the tile
            if T.call_extern("int32", reduce, T.address_of(acc[0, 0]), T.address_of(partial_sums[0]), tid) == 1:
                ws.store_tile(wg, 0, stage_output, store_output, acc, C_s, C, by, col, wg)
        else:
            ws.store_tile(wg, 0, stage_output, store_output, acc, C_s, C, by, col, wg)
        T.tma_store_wait(0)

    @T.macro
    def produce(A, B, Sc, Z, A_s, B_s, S_s, Z_s, full, empty, k_first, own):
        tx = T.get_thread_binding()
        bx, by = T.get_block_binding(0), T.get_block_binding(1)
        if tx < 32:
            for g in T.serial(count):
                slot = g % S
                k = k_first + g
                ka = T.if_then_else(g < own, k, K // bK) if longer else k  # past K: zeros
                T.barrier_wait(empty[slot], ((g // S) & 1) ^ 1)
                T.tma_copy(A[by * bM:(by + 1) * bM, ka * bK:(ka + 1) * bK], A_s[slot, :, :], barrier=full[slot])
                T.tma_copy(B[bx * panels:(bx + 1) * panels, k * bK:(k + 1) * bK, 0:PANEL_SPAN_BYTES], B_s[slot, :, :, :],
                           barrier=full[slot])
                g0 = k * bK // G
                T.tma_copy(Sc[g0:g0 + groups_per_block, bx * bN:(bx + 1) * bN], S_s[slot, :, :], barrier=full[slot])
                if fmt.has_zeros:
                    T.tma_copy(Z[g0:g0 + groups_per_block, bx * bN:(bx + 1) * bN], Z_s[slot, :, :],
                               barrier=full[slot])
                T.barrier_arrive(full[slot])
        if split > 1:
            # the consumers' cluster reduction has two cluster-wide barriers, which every thread must reach
            T.call_extern("handle", "dq_cluster_barriers<2>")

    @T.prim_func
    def main(
        A: T.Tensor((M, K), "bfloat16"),
        B: T.Tensor((N // PANEL_ROWS, K, PANEL_SPAN_BYTES), "int8"),
        Sc: T.Tensor((K // G, N), scale_dtype),
        Z: T.Tensor(zeros_shape, "bfloat16"),
        C: T.Tensor((M, N), "bfloat16"),
    ):
        with T.Kernel(*grid, threads=tile.threads, **cluster) as block:
            # every CTA runs the longer count (a static one: a trip count that differs between CTAs makes ptxas
            # serialize the wgmmas, C7513); a shorter CTA's extra block reads A past K, which the TMA zero-fills, so
            # it adds exact zeros (its weight block, the next CTA's first, is in bounds)
            k_first, own = 0, k_blocks
            if split > 1:
                k_first = block[2] * k_blocks + T.max(block[2] - first_longer, 0)
                if longer:
                    own = k_blocks + T.if_then_else(block[2] >= first_longer, 1, 0)
            A_s = T.alloc_shared((S, bM, bK), "bfloat16")
            B_s = T.alloc_shared((S, panels, bK, PANEL_SPAN_BYTES), "int8")
            S_s = T.alloc_shared((S, groups_per_block, bN), scale_dtype)
            # without zero points the decoder's zeros pointer is an unread stand-in (the scales' stage)
            Z_s = T.alloc_shared((S, groups_per_block, bN), "bfloat16") if fmt.has_zeros else None
            C_s = [T.alloc_shared((bM, rows), "bfloat16") for _ in range(consumers)]
            partial_sums = T.alloc_shared((PANEL_ROWS * bM * consumers,), "float32") if split > 1 else None
            acc = [T.alloc_fragment((rows, bM), "float32") for _ in range(consumers)]
            frags = [(T.alloc_fragment((rows, bK), "bfloat16"), T.alloc_fragment((rows, bK), "bfloat16"))
                     for _ in range(consumers)]
            full = T.alloc_barrier([32] * S)
            empty = T.alloc_barrier([consumers * 4] * S)
            T.import_source(DECODE_CUDA_SOURCE)
            # the decoder reads the packed tile and the scales through raw pointers: row-major, unswizzled
            layouts = {B_s: make_linear_layout(B_s), S_s: make_linear_layout(S_s)}
            if fmt.has_zeros:
                layouts[Z_s] = make_linear_layout(Z_s)
            # and writes the fragments (the reduction reads the sums) through raw pointers: their layouts pinned to
            # wgmma's A and D layouts, as the decode form's
            for frag in [f for pair in frags for f in pair]:
                layouts[frag] = T.Fragment(frag.shape, forward_thread_fn=fragment_thread, forward_index_fn=fragment_index)
            if split > 1:
                # (a comprehension: a `for wg in range(...)` statement here would be traced as a kernel loop)
                layouts.update({a: T.Fragment(a.shape, forward_thread_fn=consumer_fragment_thread(wg),
                                              forward_index_fn=fragment_index) for wg, a in enumerate(acc)})
            T.annotate_layout(layouts)
            if tile.swizzle:
                T.use_swizzle(tile.swizzle)
            ws.dispatch(produce, consume, (A, B, Sc, Z, A_s, B_s, S_s, Z_s, full, empty, k_first, own),
                        [(A_s, B_s, S_s, Z_s, full, empty, partial_sums, C, C_s[wg], acc[wg], *frags[wg], wg)
                         for wg in range(consumers)])

    return main


def arrange_packed(packed: torch.Tensor, arrangement: int = 1) -> torch.Tensor:
    """(rows, K/2) packed bytes as the decoder reads them, (rows/64, K, 32): in panels of 64 rows, each
    panel's K in 32-byte spans (64 K each) of its 64 rows, span-major, so that a K block of any width is one
    contiguous piece of memory per panel (row r's span s at panel r // 64, row 64·s + r % 64).

    Within a span, byte 8t + m is byte 4m + t of the row as quantized, so the 8 pairs a fragment thread decodes
    there (one per 4-byte word, byte t of each) are 8 contiguous bytes (``arrangement`` 1). In arrangement 2 (the
    int4 decodes) those 8 bytes are two little-endian 32-bit words of 4 pairs each, pair j's low code (even k)
    at bits 4j-4j+3 and its high code at bits 16+4j-19+4j, so one shift and one LOP3 place a pair in two bf16
    lanes. rows must be a multiple of 64 and K of 64 (ValueError otherwise)."""
    rows, half_k = packed.shape
    if rows % PANEL_ROWS or half_k % PANEL_SPAN_BYTES:
        raise ValueError(f"arrange_packed: the packed weight ({rows} rows x {half_k} bytes) must have a multiple of "
                         f"{PANEL_ROWS} rows (N) and of {PANEL_SPAN_BYTES} bytes per row (K a multiple of 64)")
    spans = packed.reshape(rows, half_k // 32, 8, 4).transpose(-1, -2).contiguous()
    if arrangement == 2:
        pairs = spans.view(torch.uint8).reshape(rows, half_k // 32, 4, 2, 2, 2)  # (.., t, word, half, pair)
        low, high = pairs & 0x0F, pairs >> 4
        # the word's byte 2h + e: codes of pairs 2h and 2h + 1, the low codes in bytes 0-1, the high ones in 2-3
        word = torch.stack([low[..., 0] | (low[..., 1] << 4), high[..., 0] | (high[..., 1] << 4)], dim=-2)
        spans = word.view(torch.int8)
    spans = spans.reshape(rows // PANEL_ROWS, PANEL_ROWS, half_k // PANEL_SPAN_BYTES, PANEL_SPAN_BYTES)
    return spans.transpose(1, 2).reshape(rows // PANEL_ROWS, 2 * half_k, PANEL_SPAN_BYTES).contiguous()


def packed_arrangement(fmt: W4Format) -> int:
    """The decoder's ARRANGED form of ``fmt``'s packed rows (``arrange_packed``): the int4 decodes (int4, uint4 with
    a zero point) read their codes 16 bits apart (2), the e2m1 decodes, which place bits per byte, byte-arranged
    rows (1)."""
    return 2 if fmt.kind <= 1 else 1


def prepare_dequant_w4(ops: Operands, fmt: W4Format) -> Operands:
    """The prepare of every dequant_w4_<format> variant (untimed): the packed rows arranged for the decoder,
    and for a format without zero points an unread one-element stand-in (the kernel signature is the same
    for every format)."""
    out = {"B_arranged": arrange_packed(ops["B"], packed_arrangement(fmt))}
    if not fmt.has_zeros:
        out["zeros"] = torch.empty(1, dtype=torch.bfloat16, device=ops["A"].device)
    return out


def launch_dequant_w4(kernel, ops: Operands) -> torch.Tensor:
    """The launch of every dequant_w4_<format> variant."""
    return kernel(ops["A"], ops["B_arranged"], ops["scales"], ops["zeros"])
