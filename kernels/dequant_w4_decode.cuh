#include <stdint.h>
#include <string.h>
#ifdef __CUDACC__
#define DQ_FN __device__ __forceinline__
#else
#define DQ_FN static inline
#endif

// byte permute: result byte i = byte sel[4i+2:4i] of the 8-byte value {b, a}; with bit 4i+3 of sel set,
// that byte's sign (bit 7) replicated over all 8 bits instead (prmt's default mode)
DQ_FN uint32_t dq_prmt(uint32_t a, uint32_t b, uint32_t sel) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
#else
  uint64_t x = ((uint64_t)b << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (sel >> (4 * i)) & 15, byte = (uint32_t)(x >> (8 * (s & 7))) & 0xFF;
    r |= (s & 8 ? (byte & 0x80 ? 0xFFu : 0u) : byte) << (8 * i);
  }
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

// (a & b) ^ c as one LOP3: written in C, ptxas makes it two (a SASS instruction holds one immediate)
DQ_FN uint32_t dq_and_xor(uint32_t a, uint32_t b, uint32_t c) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  return (a & b) ^ c;
#endif
}

DQ_FN uint32_t dq_float_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
DQ_FN float dq_bits_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

DQ_FN void dq_load8(const uint8_t* p, uint32_t w[2]) {
#ifdef __CUDA_ARCH__
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  w[0] = v.x; w[1] = v.y;
#else
  memcpy(w, p, 8);
#endif
}

// The two codes of one K pair at bits 0-3 (the even k) and 16-19 of x (other bits anything), of an int4 decode
// (KIND 0 or 1), to the bf16 pair {value(lo), value(hi)} * scale with one rounding. Masked and OR-ed with 0x4300
// in one LOP3, each lane is bf16 128 + c (c sits in the mantissa: exact); for int4 the XOR with 8 as well turns a
// two's complement code q into c = q + 8. Then 1 * y + (-(128 + z)) = c - z exactly (z = 8 for int4).
template <int KIND>
DQ_FN uint32_t dq_int4_pair(uint32_t x, uint32_t scale2, uint32_t offset2) {
  const uint32_t y = dq_and_xor(x, 0x000F000Fu, KIND == 0 ? 0x43084308u : 0x43004300u);
  return dq_fma_bf16x2(dq_fma_bf16x2(y, 0x3F803F80u, offset2), scale2, 0x80008000u);  // v * s + (-0): one rounding
}

// One K pair of one row: byte b (0-3) of word w holds its two codes (the low nibble the even k), decoded
// to the bf16 pair {value(lo), value(hi)} * scale with one rounding (KIND as in dq_decode_fragment).
template <int KIND>
DQ_FN uint32_t dq_decode_pair(uint32_t w, uint32_t b, uint32_t scale2, uint32_t offset2) {
  if (KIND <= 1) {
    // byte 0 of x = byte b of w, byte 2 = byte b of w >> 4: the low and the high code at bits 0-3 of each half
    return dq_int4_pair<KIND>(dq_prmt(w, w >> 4, b | (b << 4) | ((b + 4) << 8) | ((b + 4) << 12)), scale2, offset2);
  }
  // e2m1 by bit placement. A code's 3 magnitude bits (2 exponent, 1 mantissa) put at bf16 bits 6-8
  // (exponent field 0-3, top mantissa bit) make exactly value·2^-126, the zero exponent a subnormal that
  // gives 0 and 0.5·2^-126 as e2m1's own subnormal does; the sign goes to bit 15. One prmt places both
  // nibbles: byte 0 = byte b of w << 4 (the low nibble at bits 4-7), byte 1 = that byte's sign (bit 7)
  // replicated, bytes 2-3 the same for the high nibble from w; then << 2 and one mask. The exact · 2^126 is
  // one fma; the scale's fma rounds once.
  const uint32_t x = dq_prmt(w << 4, w, b | ((b | 8) << 4) | ((b + 4) << 8) | ((b + 12) << 12));
  const uint32_t v = dq_fma_bf16x2((x << 2) & 0x81C081C0u, 0x7E807E80u, 0x80008000u);
  return dq_fma_bf16x2(v, scale2, 0x80008000u);  // v * s + (-0): one rounding
}

// Decode one K block of packed 4-bit weights from shared memory into this thread's part of the
// tensor-core A-operand register fragment (bf16 pairs as uint32). (This source must not name the
// matrix instructions: the compile step classifies kernels by searching their source for them.)
//   KIND 0: int4 two's complement, scale bf16; 1: uint4 with bf16 zero point z, scale bf16;
//        2: e2m1, scale bf16; 3: e2m1, scale E8M0 (uint8).
//   packed: the block's BN rows x BK/2 bytes as the prepare stores them (kernels.dequant_w4.arrange_packed):
//     in panels of 64 rows, each panel BK/64 spans of (64 rows x 32 bytes), span-major, so 32-byte span s of
//     row r sits at ((r / 64) * BK + 64 * s + r % 64) * 32. The span holds the row's K 64s .. 64s + 63 of the
//     block, arranged (below). scales/zeros: SG x BN (SG = K groups in the block).
//   tid: thread index among the consumer threads (one warpgroup per 64 weight rows).
// Fragment (the layout annotated on the TileLang side): thread tid holds rows
// r_h = 16*(tid/32) + (tid%32)/4 + 8h and, for every 8-wide K chunk c, the pair k = 8c + 2t, 8c + 2t + 1
// (t = tid%4) -- byte 4c + t of the row as quantized -- as frag[2c + h].
// ARRANGED 1: in every span a thread's 8 pairs (c = 8s .. 8s + 7) are the 8 bytes at 8t: one 8-byte load.
// ARRANGED 2 (int4, uint4): the same 8 bytes, as two 32-bit words of 4 pairs each with a pair's two codes 16 bits
// apart (pair j of a word at bits 4j and 16 + 4j), so that a shift and one LOP3 put both codes in the two bf16
// lanes, with no byte permute. A warp's 8 rows x 4 threads read 256 contiguous bytes per load: no bank conflict.
template <int KIND, int BK, int GROUP, int BN, int ARRANGED>
DQ_FN void dq_decode_fragment(void* frag_, const void* packed_, const void* scales_, const void* zeros_, int tid) {
  static_assert(BK % 64 == 0, "a panel's K block is read in 32-byte spans of 64 K: BK a multiple of 64");
  static_assert(BN % 64 == 0, "the packed tile is in panels of 64 rows");
  static_assert(ARRANGED == 1 || ARRANGED == 2, "the packed rows are arranged (1: bytes, 2: nibbles)");
  static_assert(ARRANGED != 2 || KIND <= 1, "nibbles 16 bits apart: the int4 decode only (KIND 0 or 1)");
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
    const uint8_t* spans = packed + ((row >> 6) * BK + (row & 63)) * 32 + 8 * (int)t;
#pragma unroll
    for (int s = 0; s < BK / 64; ++s) {
      uint32_t u[2];
      dq_load8(spans + 64 * 32 * s, u);
#pragma unroll
      for (int m = 0; m < 8; ++m) {
        const int c = 8 * s + m;
        const int sg = BK >= GROUP ? (8 * c) / GROUP : 0;
        // ARRANGED 2: pair m's two codes at bits 4j and 16 + 4j of word m / 4 (j = m % 4)
        frag[2 * c + h] = ARRANGED == 2
            ? dq_int4_pair<KIND>(u[m >> 2] >> (4 * (m & 3)), scale2[sg], offset2[sg])
            : dq_decode_pair<KIND>(u[m >> 2], (uint32_t)(m & 3), scale2[sg], offset2[sg]);
      }
    }
  }
}

#ifdef __CUDA_ARCH__
// N cluster-wide barriers (arrive with release, wait with acquire): every thread of the cluster must reach each;
// dq_cluster_reduce's two, and the same two for the threads that hold no sums (the overlapped form's producer).
template <int N>
__device__ __forceinline__ void dq_cluster_barriers() {
#pragma unroll
  for (int n = 0; n < N; ++n)
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Split-K over a thread-block cluster: the SPLITS CTAs of one output tile (the cluster's z extent, each
// with its own K range) hold partial fp32 sums in the same fragment layout, so register r of thread tid
// is the same output element in every CTA. Every CTA but rank 0 stores its sums in its own shared
// memory ([r/4][tid][r%4], 16-byte per thread), the cluster syncs, and rank 0 adds its peers' sums
// through distributed shared memory in rank order (deterministic: no atomics, no workspace, no second
// kernel); a second cluster sync keeps the peers' shared memory alive until rank 0 has read it.
// Returns 1 in rank 0, which then stores the tile, and 0 elsewhere. REGS: fp32 sums per thread.
template <int REGS, int THREADS>
__device__ __forceinline__ int dq_cluster_reduce(void* acc_, void* red_, int tid) {
  static_assert(REGS % 4 == 0, "the partial sums travel 4 at a time");
  float* acc = reinterpret_cast<float*>(acc_);
  float4* red = reinterpret_cast<float4*>(red_);
  uint32_t rank, ctas;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(ctas));
  if (rank != 0) {
#pragma unroll
    for (int q = 0; q < REGS / 4; ++q)
      red[q * THREADS + tid] = make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
  }
  dq_cluster_barriers<1>();
  if (rank == 0) {
    const uint32_t local = (uint32_t)__cvta_generic_to_shared(red);
    for (uint32_t peer = 1; peer < ctas; ++peer) {
      uint32_t remote;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(peer));
#pragma unroll
      for (int q = 0; q < REGS / 4; ++q) {
        float x, y, z, w;
        asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(x), "=f"(y), "=f"(z), "=f"(w) : "r"(remote + 16u * (q * THREADS + tid)) : "memory");
        acc[4 * q] += x; acc[4 * q + 1] += y; acc[4 * q + 2] += z; acc[4 * q + 3] += w;
      }
    }
  }
  dq_cluster_barriers<1>();
  return rank == 0;
}
#endif
