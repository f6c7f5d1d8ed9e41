/* mma.cuh: bf16 tensor-core helpers shared by the attention kernels: mma.sync m16n8k16 with
 * fp32 accumulation and the fragment layouts it implies (PTX ISA, "Matrix Fragments for
 * mma.m16n8k16"): for lane = 4 gid + tig,
 *   A (16 x 16, row-major):  {a0,a1} row gid, cols 2 tig, 2 tig + 1; {a2,a3} row gid + 8;
 *                            {a4,a5} row gid, cols + 8; {a6,a7} row gid + 8, cols + 8
 *   B (16 x 8, k x n):       {b0,b1} rows k = 2 tig, 2 tig + 1 of col n = gid; {b2,b3} k + 8
 *   C (16 x 8):              {c0,c1} row gid, cols 2 tig, 2 tig + 1; {c2,c3} row gid + 8
 * so the C tiles of two adjacent n-tiles are, packed to bf16, the A fragment of a 16-wide k-step
 * (how a probability tile feeds the next product without leaving registers).
 * Tiles live in shared memory as bf16 rows of MMA_LDS elements; a "transposed" tile stores
 * element (row r, col c) at [c][r ^ 8 (c / 8)] (an XOR swizzle of 8-element chunks, free of bank
 * conflicts both when written and when read as B fragments). */
#ifndef FOCUS_CUDA_MMA_CUH
#define FOCUS_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#define MMA_LDS 72 /* padded shared-memory row, in bf16 elements (144 bytes: no bank conflicts) */

__device__ __forceinline__ uint32_t ld32(const __nv_bfloat16* p) { return *(const uint32_t*)p; }

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t*)&v;
}

__device__ __forceinline__ void mma16816(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* B fragment (n-tile nt, k-step kk) of a product whose B^T is stored row-major: Y[n][k]. */
__device__ __forceinline__ void bfrag_rows(uint32_t& b0, uint32_t& b1, const __nv_bfloat16* Y,
                                           int nt, int kk, int gid, int tig) {
    const __nv_bfloat16* p = Y + (nt * 8 + gid) * MMA_LDS + kk * 16 + tig * 2;
    b0 = ld32(p);
    b1 = ld32(p + 8);
}

/* B fragment of a product whose B is stored transposed (see the file comment): Z^T. */
__device__ __forceinline__ void bfrag_swz(uint32_t& b0, uint32_t& b1, const __nv_bfloat16* Zt,
                                          int nt, int kk, int gid, int tig) {
    const __nv_bfloat16* p = Zt + (nt * 8 + gid) * MMA_LDS;
    b0 = ld32(p + ((kk * 16 + tig * 2) ^ (nt << 3)));
    b1 = ld32(p + ((kk * 16 + 8 + tig * 2) ^ (nt << 3)));
}

/* A fragments of the 16 x 64 bf16 product operand formed by a C-layout fp32 tile c[8][4]
 * (16 rows x 64 cols): k-step kk covers cols 16 kk .. 16 kk + 15. */
__device__ __forceinline__ void afrag_from_c(uint32_t (&a)[4], const float (&c)[8][4], int kk) {
    a[0] = pack_bf16(c[2 * kk][0], c[2 * kk][1]);
    a[1] = pack_bf16(c[2 * kk][2], c[2 * kk][3]);
    a[2] = pack_bf16(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[3] = pack_bf16(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

/* c (16 x 64, C layout) = A B for a warp's A fragments a (16 rows x 64) and B^T stored
 * row-major in Y (64 rows of 64): scores Q K^T, dO V^T and their transposes. */
__device__ __forceinline__ void mma_tile_rows(float (&c)[8][4], const uint32_t (&a)[4][4],
                                              const __nv_bfloat16* Y, int gid, int tig) {
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
        c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t b0, b1;
            bfrag_rows(b0, b1, Y, nt, kk, gid, tig);
            mma16816(c[nt], a[kk], b0, b1);
        }
    }
}

/* acc (16 x 64) += c Z, with c a C-layout fp32 tile (16 x 64) used as bf16 A fragments and Z
 * (64 x 64) stored transposed in Zt: P V, dS K, P^T dO, dS^T Q. */
__device__ __forceinline__ void mma_tile_swz(float (&acc)[8][4], const float (&c)[8][4],
                                             const __nv_bfloat16* Zt, int gid, int tig) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[4];
        afrag_from_c(a, c, kk);
#pragma unroll
        for (int dt = 0; dt < 8; dt++) {
            uint32_t b0, b1;
            bfrag_swz(b0, b1, Zt, dt, kk, gid, tig);
            mma16816(acc[dt], a, b0, b1);
        }
    }
}

/* The online-softmax step of one key tile for a warp's 16 query rows (gid and gid + 8): s holds
 * the tile's scores in log2 units (-inf where masked), mx0 / mx1 this lane's maxima of them;
 * (m, l) are the rows' running maxima and sums. o is rescaled and P V added, P packed to bf16
 * straight from the score registers (Vt: the tile's values, transposed). */
__device__ __forceinline__ void softmax_tile_pv(float (&s)[8][4], float (&o)[8][4], float mx0,
                                                float mx1, float& m0, float& m1, float& l0,
                                                float& l1, const __nv_bfloat16* Vt, int gid,
                                                int tig) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
    const float c0 = exp2f(m0 - mu0), c1 = exp2f(m1 - mu1);
    l0 *= c0;
    l1 *= c1;
#pragma unroll
    for (int dt = 0; dt < 8; dt++) {
        o[dt][0] *= c0;
        o[dt][1] *= c0;
        o[dt][2] *= c1;
        o[dt][3] *= c1;
    }
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
        s[nt][0] = exp2f(s[nt][0] - mu0);
        s[nt][1] = exp2f(s[nt][1] - mu0);
        s[nt][2] = exp2f(s[nt][2] - mu1);
        s[nt][3] = exp2f(s[nt][3] - mu1);
        l0 += s[nt][0] + s[nt][1];
        l1 += s[nt][2] + s[nt][3];
    }
    m0 = mn0;
    m1 = mn1;
    mma_tile_swz(o, s, Vt, gid, tig);
}

/* Row sums over the 4 lanes that share rows gid and gid + 8. */
__device__ __forceinline__ void quad_sum2(float& a, float& b) {
    a += __shfl_xor_sync(0xffffffffu, a, 1);
    a += __shfl_xor_sync(0xffffffffu, a, 2);
    b += __shfl_xor_sync(0xffffffffu, b, 1);
    b += __shfl_xor_sync(0xffffffffu, b, 2);
}

#endif
