"""int4_unpack_s8 and int4_unpack_s8_ss: the Hopper int4 GEMM, C = A_int · B_intᵀ in int32, A (M,K),
B (N,K) int4 packed two per byte along K (``formats.pack_int4``).

Hopper has no int4 tensor cores, so the packed bytes are TMA-loaded (half the traffic of int8),
expanded to int8 inside the kernel and multiplied with s8 ``wgmma``. ``int4_unpack_s8`` decodes A
straight into the wgmma register fragment and B into a shared tile; ``int4_unpack_s8_ss`` decodes both
into shared memory (the simpler fallback). Two K blocks per pipeline stage let the decode of one block
overlap the asynchronous ``wgmma`` of the other.

Inside the kernel the decoded K order within each K block differs from the logical one: decoded column
j < block_K/2 holds the low nibble of packed byte j (logical K 2j), column block_K/2 + j its high nibble
(logical 2j + 1). A and B use the same order, so the dot products over K, and hence C, are unchanged.
The nibble arithmetic (``select_nibbles``, ``sign_extend_nibbles``) is written once at module level:
the kernel calls it with ``T.uint32``, the tests with ``int`` on torch tensors.

TileLang evaluates a prim_func's annotations with the factory's closure variables, so this module
must not use ``from __future__ import annotations``.
"""
import torch

from kernels.formats import check_gemm_shape
from kernels.registry import Operands, refuse_shape
from kernels.tiles import SMEM_LIMIT_BYTES, Tile

# The nibble decode: one Python expression for the kernel and the tests. ``const`` makes a 32-bit
# constant: T.uint32 in the kernel (uint32 arithmetic), int in the tests (torch int64 tensors holding
# the words, 0 <= word < 2^32: no step of it leaves 32 bits).


def select_nibbles(word, const, shift=None):
    """The low nibble of each byte lane of a 32-bit word (``shift`` None), or of ``word >> shift``
    (shift 4: the high nibbles), as four lanes of 0..15."""
    return (word if shift is None else word >> shift) & const(0x0F0F0F0F)


def sign_extend_nibbles(x, const):
    """Four nibbles (0..15) in byte lanes -> four sign-extended int8 lanes; no cross-lane carry: each
    lane whose nibble has bit 3 set gets 0xF0 ORed in ((x & 0x08) * 0x1E = 0xF0)."""
    return x | ((x & const(0x08080808)) * const(0x1E))


def int4_unpack_s8_shape_limit(M: int, N: int, K: int) -> str | None:
    """Also int4_unpack_s8_ss's shape limit."""
    if K % 32:
        return f"int4_unpack_s8 needs K divisible by 32 (TMA: packed rows of K/2 bytes 16-byte aligned), K={K}"
    return None


def int4_unpack_s8_kernel(M: int, N: int, K: int, tile: Tile, a_in_registers: bool = True):
    """Packed int4 in global memory, decoded to int8 in the kernel, s8 ``wgmma``, int32 out (Hopper).

    Also int4_unpack_s8_ss's kernel (``a_in_registers`` False).
    The packed operands are passed as int32 views, A (M, K/8) and B (N, K/8): one word = 8 nibbles.
    Each pipeline stage TMA-loads two K blocks (2·block_K values) of packed A and B. Per K block s:
    B is decoded into shared tile B{s} (16 packed bytes -> two 16-byte stores per thread), A into
    register fragment A{s} (``a_in_registers``) or a shared tile; then the warpgroups wait for
    the previous ``wgmma`` batch, sync, and issue this block's ``wgmma`` without waiting. So the
    decode of block k+1 runs while the tensor cores work on block k, and a buffer is rewritten only
    after the ``wgmma`` that read it has retired (the wait precedes the barrier before each issue).
    """
    check_gemm_shape("int4_unpack_s8_kernel", M, N, K)
    import tilelang.language as T
    from tilelang.layout import make_swizzled_layout

    bM, bN, bK, threads = tile.block_M, tile.block_N, tile.block_K, tile.threads
    refuse_shape(int4_unpack_s8_shape_limit, M, N, K)
    if bK % 32:
        raise ValueError(f"int4_unpack_s8: block_K={bK} must be a multiple of 32 (s8 wgmma k32, 16-byte decode chunks)")
    for rows in (bN,) if a_in_registers else (bN, bM):
        if (rows * (bK // 32)) % threads:
            raise ValueError(
                f"int4_unpack_s8: {rows} rows x {bK // 32} chunks of 16 packed bytes per K block must divide "
                f"evenly over {threads} threads"
            )
    smem = tile.num_stages * (bM + bN) * bK + 2 * bN * bK + (0 if a_in_registers else 2 * bM * bK)
    if smem > SMEM_LIMIT_BYTES["sm_90a"]:
        raise ValueError(
            f"int4_unpack_s8: tile {tile.name} needs {smem} bytes of shared memory "
            f"({tile.num_stages} stages x {(bM + bN) * bK} packed + decoded tiles), over Hopper's {SMEM_LIMIT_BYTES['sm_90a']}"
        )
    bKw = bK // 8  # packed int32 words per row per K block
    half = bK // 2
    chunks = bKw // 4  # 16-byte chunks of packed words per row per K block
    policy = getattr(T.GemmWarpPolicy, tile.policy)

    @T.macro
    def decode_to_shared(P, col0, D, rows, tx, packed, decoded, decoded_bytes):
        # One thread: 16 packed bytes (4 words) -> 16 low-nibble bytes + 16 high-nibble bytes.
        for it in T.unroll(rows * chunks // threads):
            r = (it * threads + tx) // chunks
            c = (it * threads + tx) % chunks
            for v in T.vectorized(4):
                packed[v] = P[r, col0 + c * 4 + v]
            for v in T.unroll(4):
                u = T.Cast("uint32", packed[v])
                decoded[v] = T.Cast("int32", sign_extend_nibbles(select_nibbles(u, T.uint32), T.uint32))
                decoded[4 + v] = T.Cast("int32", sign_extend_nibbles(select_nibbles(u, T.uint32, T.uint32(4)), T.uint32))
            for v in T.vectorized(16):
                D[r, c * 16 + v] = decoded_bytes[v]
            for v in T.vectorized(16):
                D[r, half + c * 16 + v] = decoded_bytes[16 + v]

    @T.macro
    def decode_to_fragment(P, col0, F, rows):
        # Same K order as decode_to_shared; the vectorizer packs 4 lanes into one register.
        for i, j in T.Parallel(rows, bK):
            word = T.Cast("uint32", P[i, col0 + (j % half) // 4])
            nibbles = select_nibbles(word, T.uint32, T.Cast("uint32", 4 * (j // half)))
            F[i, j] = T.Cast("int8", sign_extend_nibbles(nibbles, T.uint32) >> T.Cast("uint32", 8 * (j % 4)))

    @T.prim_func
    def main(
        A: T.Tensor((M, K // 8), "int32"),
        B: T.Tensor((N, K // 8), "int32"),
        C: T.Tensor((M, N), "int32"),
    ):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=threads) as (bx, by):
            A_packed = T.alloc_shared((bM, 2 * bKw), "int32")
            B_packed = T.alloc_shared((bN, 2 * bKw), "int32")
            if a_in_registers:
                A0 = T.alloc_fragment((bM, bK), "int8")
                A1 = T.alloc_fragment((bM, bK), "int8")
            else:
                A0 = T.alloc_shared((bM, bK), "int8")
                A1 = T.alloc_shared((bM, bK), "int8")
            B0 = T.alloc_shared((bN, bK), "int8")
            B1 = T.alloc_shared((bN, bK), "int8")
            C_local = T.alloc_fragment((bM, bN), "int32")
            packed = T.alloc_local((4,), "int32")
            decoded = T.alloc_local((8,), "int32")
            decoded_bytes = T.view(decoded, (32,), "int8")
            tx = T.get_thread_binding()
            # swizzled packed tiles: the decoders' row-strided reads would otherwise hit the same banks
            T.annotate_layout({A_packed: make_swizzled_layout(A_packed), B_packed: make_swizzled_layout(B_packed)})
            if tile.swizzle:
                T.use_swizzle(tile.swizzle)
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(K, 2 * bK), num_stages=tile.num_stages):
                T.copy(A[by * bM, ko * 2 * bKw], A_packed)
                T.copy(B[bx * bN, ko * 2 * bKw], B_packed)
                for s, (A_s, B_s) in enumerate(((A0, B0), (A1, B1))):
                    decode_to_shared(B_packed, s * bKw, B_s, bN, tx, packed, decoded, decoded_bytes)
                    if a_in_registers:
                        decode_to_fragment(A_packed, s * bKw, A_s, bM)
                    else:
                        decode_to_shared(A_packed, s * bKw, A_s, bM, tx, packed, decoded, decoded_bytes)
                    T.wait_wgmma(0)  # the other buffer pair's wgmma has retired before the sync below
                    T.wgmma_gemm(A_s, B_s, C_local, transpose_B=True, policy=policy)
            T.wait_wgmma(0)
            T.copy(C_local, C[by * bM, bx * bN])

    return main


def launch_int4_unpack_s8(kernel, ops: Operands) -> torch.Tensor:
    """Also int4_unpack_s8_ss's (and int4_ws's) launch."""
    # same bytes, read as words of 8 nibbles (a view, no copy)
    return kernel(ops["A_packed"].view(torch.int32), ops["B_packed"].view(torch.int32))
