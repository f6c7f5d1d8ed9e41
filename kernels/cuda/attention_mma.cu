/* attention_mma.cu: the training attention of attention.cu (causal, grouped-query, with the
 * Focus gate) on bf16 tensor cores, head size 64: forward, and a FlashAttention-2-style backward
 * (one kernel over query blocks for dQ and the row half of the gate gradient, one over key blocks
 * for dK, dV and the column half). Operands are rounded to bf16 as tiles are staged in shared
 * memory; products accumulate in fp32; scores, the gate, softmax statistics and gradients of the
 * gate stay in fp32. Each of the 4 warps of a block owns 16 rows of a 64-row tile (mma.cuh has
 * the fragment layouts). The model's training steps use these kernels for head size 64 and
 * K <= MMA_MAXK groups unless FOCUS_ATTN_MMA=0; tests/test_cuda.c compares them with the CPU. */
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "cuda.h"
#include "gate.cuh"
#include "mma.cuh"

#define MMA_MAXK 8 /* groups whose vectors a block keeps in shared memory */
#define LN2F 0.6931471805599453f
#define LOG2EF 1.4426950408889634f

/* 64 rows x 64 fp32 (row stride ld) -> bf16 tile, row-major and/or transposed; rows >= n are 0. */
__device__ __forceinline__ void stage_tile(__nv_bfloat16* rowmajor, __nv_bfloat16* transposed,
                                           const float* src, size_t ld, int n) {
    for (int x = threadIdx.x; x < 64 * 8; x += blockDim.x) {
        const int r = x >> 3, c8 = (x & 7) * 8;
        float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (r < n) {
            float4 a = *(const float4*)(src + (size_t)r * ld + c8);
            float4 b = *(const float4*)(src + (size_t)r * ld + c8 + 4);
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
            v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        }
        if (rowmajor) {
            uint4 u = make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]),
                                 pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7]));
            *(uint4*)(rowmajor + r * MMA_LDS + c8) = u;
        }
        if (transposed) {
#pragma unroll
            for (int e = 0; e < 8; e++)
                transposed[(c8 + e) * MMA_LDS + (r ^ c8)] = __float2bfloat16_rn(v[e]);
        }
    }
}

/* A fragments (4 k-steps of 16 of a 64-wide row) of rows r0 and r0 + 8 read straight from fp32
 * global memory (row stride ld); rows at or past nvalid are 0. */
__device__ __forceinline__ void afrag_global(uint32_t (&a)[4][4], const float* rows, size_t ld,
                                             int r0, int nvalid, int tig) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        float2 x[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            int r = r0 + (q & 1) * 8, c = kk * 16 + (q >> 1) * 8 + tig * 2;
            x[q] = r < nvalid ? *(const float2*)(rows + (size_t)r * ld + c) : make_float2(0.f, 0.f);
        }
        a[kk][0] = pack_bf16(x[0].x, x[0].y);
        a[kk][1] = pack_bf16(x[1].x, x[1].y);
        a[kk][2] = pack_bf16(x[2].x, x[2].y);
        a[kk][3] = pack_bf16(x[3].x, x[3].y);
    }
}

/* ---- the gate, as these kernels evaluate it ----
 * Group vectors are staged zero-padded to MMA_MAXK = 8 entries, so that an affinity is two
 * float4 loads and 8 FMAs whatever K is (the padding adds nothing); the vectors of a thread's own
 * two rows stay in registers, and so do their gate gradients until the block ends. The
 * log-sigmoid uses the fast exp / log (these kernels compare at bf16 tolerances; attention.cu
 * keeps the precise one). */
struct GVec {
    float4 a, b;
};

__device__ __forceinline__ GVec gvec_zero(void) {
    GVec v;
    v.a = v.b = make_float4(0.f, 0.f, 0.f, 0.f);
    return v;
}

__device__ __forceinline__ GVec gvec_load(const float* g8) {
    GVec v;
    v.a = *(const float4*)g8;
    v.b = *(const float4*)(g8 + 4);
    return v;
}

__device__ __forceinline__ float gvec_dot(const GVec& x, const GVec& y) {
    float s = x.a.x * y.a.x;
    s = fmaf(x.a.y, y.a.y, s);
    s = fmaf(x.a.z, y.a.z, s);
    s = fmaf(x.a.w, y.a.w, s);
    s = fmaf(x.b.x, y.b.x, s);
    s = fmaf(x.b.y, y.b.y, s);
    s = fmaf(x.b.z, y.b.z, s);
    return fmaf(x.b.w, y.b.w, s);
}

__device__ __forceinline__ void gvec_axpy(GVec& acc, float c, const GVec& y) {
    acc.a.x = fmaf(c, y.a.x, acc.a.x);
    acc.a.y = fmaf(c, y.a.y, acc.a.y);
    acc.a.z = fmaf(c, y.a.z, acc.a.z);
    acc.a.w = fmaf(c, y.a.w, acc.a.w);
    acc.b.x = fmaf(c, y.b.x, acc.b.x);
    acc.b.y = fmaf(c, y.b.y, acc.b.y);
    acc.b.z = fmaf(c, y.b.z, acc.b.z);
    acc.b.w = fmaf(c, y.b.w, acc.b.w);
}

/* Sums a row's gate gradient over the 4 lanes (tig) that share it, then adds entries tig and
 * tig + 4 of it to dG row `row` (atomics: other heads and the other kernel add to it too). */
__device__ __forceinline__ void gvec_flush(float* dG, GVec v, size_t row, int K, int tig) {
    float* c = &v.a.x; /* a and b are adjacent: 8 floats */
#pragma unroll
    for (int k = 0; k < 8; k++) {
        c[k] += __shfl_xor_sync(0xffffffffu, c[k], 1);
        c[k] += __shfl_xor_sync(0xffffffffu, c[k], 2);
    }
    const float lo = tig == 0 ? v.a.x : tig == 1 ? v.a.y : tig == 2 ? v.a.z : v.a.w;
    const float hi = tig == 0 ? v.b.x : tig == 1 ? v.b.y : tig == 2 ? v.b.z : v.b.w;
    if (tig < K && lo != 0.f) atomicAdd(dG + row * K + tig, lo);
    if (tig + 4 < K && hi != 0.f) atomicAdd(dG + row * K + tig + 4, hi);
}

/* log sigmoid(x), and in sneg its derivative sigmoid(-x). */
__device__ __forceinline__ float logsig_fast(float x, float& sneg) {
    const float e = __expf(-fabsf(x)), r = __fdividef(1.f, 1.f + e);
    sneg = x >= 0.f ? e * r : r;
    return fminf(x, 0.f) - __logf(1.f + e);
}

/* Load n rows of the group vectors (zero-padded to 8) or masks of a tile into shared memory. */
__device__ __forceinline__ void stage_gate(float* Gs, uint32_t* ms, const GateArgs& g, size_t row0,
                                           int n) {
    if (g.mode == GATE_SOFT)
        for (int x = threadIdx.x; x < 64 * MMA_MAXK; x += blockDim.x) {
            const int r = x / MMA_MAXK, k = x % MMA_MAXK;
            Gs[x] = r < n && k < g.K ? g.G[(row0 + r) * g.K + k] : 0.f;
        }
    for (int x = threadIdx.x; x < 64; x += blockDim.x)
        ms[x] = g.mode == GATE_HARD && x < n ? g.mask[row0 + x] : 0u;
}

/* The gate of a valid pair (i, j) given the query's and key's vectors / masks: 0 when local,
 * else log sigmoid(lambda (aff - b)) (soft; *aff and *sneg set) or 0 / -inf (hard). `far`
 * tells whether the pair is gated at all. */
__device__ __forceinline__ float pair_gate(const GateArgs& g, int far, const GVec& gi,
                                           const GVec& gj, uint32_t mi, uint32_t mj, float& aff,
                                           float& sneg) {
    aff = 0.f, sneg = 0.f;
    if (!far) return 0.f;
    if (g.mode == GATE_HARD) return (mi & mj) ? 0.f : -INFINITY;
    aff = gvec_dot(gi, gj);
    return logsig_fast(g.lambda * (aff - g.bias), sneg);
}

/* This thread's place in a 128-thread block: group gid and thread tig in the group of the
 * m16n8 fragments, and the two rows r0, r1 (of the block's 64) whose elements it holds. */
struct MmaLane {
    int gid, tig, r0, r1;
};
__device__ __forceinline__ MmaLane mma_lane(void) {
    const int warp = threadIdx.x >> 5, gid = (threadIdx.x & 31) >> 2;
    return {gid, (int)threadIdx.x & 3, warp * 16 + gid, warp * 16 + gid + 8};
}

/* The (b, h) and 64-row query tile of this block, the last tile (the longest) first across all
 * (b, h); kvh is the key/value head h reads. */
struct QueryTile {
    int b, h, kvh, q0;
};
__device__ __forceinline__ QueryTile longest_tile_first(int T, int NH, int NKV) {
    const int nblk = (T + 63) / 64, nbh = gridDim.x / nblk;
    const int blk = nblk - 1 - (int)(blockIdx.x / nbh), bh = (int)(blockIdx.x % nbh);
    return {bh / NH, bh % NH, (bh % NH) / (NH / NKV), blk * 64};
}

/* This thread's two rows r0, r1 of a staged tile: group vectors (soft gate) and masks. */
__device__ __forceinline__ void row_gates(GVec (&gv)[2], uint32_t (&mv)[2], const float* Gs,
                                          const uint32_t* ms, int r0, int r1, int soft) {
    gv[0] = gv[1] = gvec_zero();
    if (soft) gv[0] = gvec_load(Gs + r0 * MMA_MAXK), gv[1] = gvec_load(Gs + r1 * MMA_MAXK);
    mv[0] = ms[r0], mv[1] = ms[r1];
}

/* Every (query row, key) pair this thread holds of a 64 x 64 score tile in mma layout: f(nt, e,
 * hf, key, gj, mj) for element e of n-tile nt, row half hf, with the key's group vector and mask
 * (zero unless the tile is gated). */
template <class F>
__device__ __forceinline__ void for_query_key_pairs(const float* Gk, const uint32_t* mk, int soft,
                                                    int gated, int tig, F f) {
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            const int key = nt * 8 + tig * 2 + e2;
            const GVec gj = soft && gated ? gvec_load(Gk + key * MMA_MAXK) : gvec_zero();
            const uint32_t mj = gated ? mk[key] : 0u;
#pragma unroll
            for (int hf = 0; hf < 2; hf++) f(nt, 2 * hf + e2, hf, key, gj, mj);
        }
    }
}

/* The key tile k0 .. k0 + n - 1 (n up to 64, keys before kend) of query tile q0: interior, every
 * key precedes every query row (no masking); gated, some pair lies outside the local band. */
struct KeyTile {
    int n, interior, gated;
};
__device__ __forceinline__ KeyTile key_tile(const GateArgs& g, int q0, int k0, int kend) {
    return {min(64, kend - k0), k0 + 64 <= q0, g.mode != GATE_NONE && q0 + 63 - k0 > g.w};
}

/* Between two barriers, keys k0 .. k0 + kn - 1 of a sequence (base: its first qkv row, row0: its
 * first token) into shared memory: K at column koff and V at voff, each row-major and/or
 * transposed (NULL skips a layout), and the keys' gates when the tile is gated. */
__device__ __forceinline__ void stage_keys(__nv_bfloat16* Ks, __nv_bfloat16* Kt, __nv_bfloat16* Vs,
                                           __nv_bfloat16* Vt, float* Gk, uint32_t* mk,
                                           const GateArgs& g, int gated, const float* base,
                                           size_t row0, int k0, int kn, int QKV, int koff,
                                           int voff) {
    __syncthreads();
    stage_tile(Ks, Kt, base + (size_t)k0 * QKV + koff, QKV, kn);
    stage_tile(Vs, Vt, base + (size_t)k0 * QKV + voff, QKV, kn);
    if (gated) stage_gate(Gk, mk, g, row0 + k0, kn);
    __syncthreads();
}

__device__ __forceinline__ void zero_acc(float (&a)[8][4]) {
#pragma unroll
    for (int dt = 0; dt < 8; dt++) a[dt][0] = a[dt][1] = a[dt][2] = a[dt][3] = 0.f;
}

/* ---- forward: out (B, T, NH*64), lse (B, NH, T) ---- */
__global__ void __launch_bounds__(128)
    attn_mma_fwd_kernel(float* out, float* lse, const float* qkv, GateArgs g, int T, int NH,
                        int NKV, float scale) {
    __shared__ __align__(16) __nv_bfloat16 Ks[64 * MMA_LDS];
    __shared__ __align__(16) __nv_bfloat16 Vt[64 * MMA_LDS];
    __shared__ __align__(16) float Gq[64 * MMA_MAXK];
    __shared__ __align__(16) float Gk[64 * MMA_MAXK];
    __shared__ uint32_t mq[64], mk[64];
    const MmaLane ln = mma_lane();
    const int gid = ln.gid, tig = ln.tig, r0 = ln.r0, r1 = ln.r1, soft = g.mode == GATE_SOFT;
    const QueryTile qt = longest_tile_first(T, NH, NKV);
    const int b = qt.b, h = qt.h, kvh = qt.kvh, q0 = qt.q0, QKV = (NH + 2 * NKV) * 64, C = NH * 64;
    const float* base = qkv + (size_t)b * T * QKV;
    uint32_t qa[4][4];
    afrag_global(qa, base + (size_t)q0 * QKV + h * 64, QKV, r0, T - q0, tig);
    stage_gate(Gq, mq, g, (size_t)b * T + q0, min(64, T - q0));
    __syncthreads();
    GVec gi[2];
    uint32_t mi[2];
    row_gates(gi, mi, Gq, mq, r0, r1, soft);
    float o[8][4];
    zero_acc(o);
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    const int kend = min(q0 + 64, T);
    for (int k0 = 0; k0 < kend; k0 += 64) {
        const KeyTile kt = key_tile(g, q0, k0, kend);
        const int kn = kt.n, interior = kt.interior, gated = kt.gated;
        stage_keys(Ks, NULL, NULL, Vt, Gk, mk, g, gated, base, (size_t)b * T, k0, kn, QKV,
                   C + kvh * 64, C + NKV * 64 + kvh * 64);
        float s[8][4];
        mma_tile_rows(s, qa, Ks, gid, tig);
        for_query_key_pairs(Gk, mk, soft, gated, tig,
                            [&](int nt, int e, int hf, int key, const GVec& gj, uint32_t mj) {
                                const int i = q0 + (hf ? r1 : r0), j = k0 + key;
                                float x = -INFINITY;
                                if (interior || (key < kn && i < T && j <= i)) {
                                    float aff, sneg;
                                    const float gate = pair_gate(g, gated && gate_far(g, i, j),
                                                                 gi[hf], gj, mi[hf], mj, aff, sneg);
                                    x = (s[nt][e] * scale + gate) * LOG2EF;
                                }
                                s[nt][e] = x;
                            });
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
        }
        softmax_tile_pv(s, o, mx0, mx1, m0, m1, l0, l1, Vt, gid, tig);
    }
    quad_sum2(l0, l1);
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int i = q0 + (half ? r1 : r0);
        if (i >= T) continue;
        const float l = half ? l1 : l0, m = half ? m1 : m0, inv = 1.f / l;
        float* op = out + ((size_t)b * T + i) * C + h * 64 + tig * 2;
#pragma unroll
        for (int dt = 0; dt < 8; dt++)
            *(float2*)(op + dt * 8) = make_float2(o[dt][2 * half] * inv, o[dt][2 * half + 1] * inv);
        if (tig == 0) lse[((size_t)b * NH + h) * T + i] = (m + log2f(l)) * LN2F;
    }
}

/* D[b, h, i] = sum_d dout * out over the row's 64 dims: a warp per (row, head). */
__global__ void attn_rowdot_kernel(float* D, const float* dout, const float* out, int B, int T,
                                   int NH) {
    size_t wg = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (wg >= (size_t)B * T * NH) return;
    int h = (int)(wg % NH);
    size_t bt = wg / NH;
    const float* x = dout + bt * NH * 64 + h * 64;
    const float* y = out + bt * NH * 64 + h * 64;
    float s = x[lane] * y[lane] + x[lane + 32] * y[lane + 32];
    s = warp_sum(s);
    if (lane == 0) D[((bt / T) * NH + h) * T + bt % T] = s;
}

/* ---- backward over query blocks: dQ, the row half of dG, dlambda and db ---- */
__global__ void __launch_bounds__(128)
    attn_mma_bwd_dq_kernel(float* dqkv, float* dG, float* dgate, const float* Dbuf,
                           const float* dout, const float* qkv, const float* lse, GateArgs g, int T,
                           int NH, int NKV, float scale) {
    __shared__ __align__(16) __nv_bfloat16 Ks[64 * MMA_LDS];
    __shared__ __align__(16) __nv_bfloat16 Kt[64 * MMA_LDS];
    __shared__ __align__(16) __nv_bfloat16 Vs[64 * MMA_LDS];
    __shared__ __align__(16) float Gq[64 * MMA_MAXK];
    __shared__ __align__(16) float Gk[64 * MMA_MAXK];
    __shared__ uint32_t mq[64], mk[64];
    __shared__ float red[2][32];
    const MmaLane ln = mma_lane();
    const int gid = ln.gid, tig = ln.tig, r0 = ln.r0, r1 = ln.r1, soft = g.mode == GATE_SOFT;
    const QueryTile qt = longest_tile_first(T, NH, NKV);
    const int b = qt.b, h = qt.h, kvh = qt.kvh, q0 = qt.q0, QKV = (NH + 2 * NKV) * 64, C = NH * 64;
    const float* base = qkv + (size_t)b * T * QKV;
    uint32_t qa[4][4], da[4][4];
    afrag_global(qa, base + (size_t)q0 * QKV + h * 64, QKV, r0, T - q0, tig);
    afrag_global(da, dout + ((size_t)b * T + q0) * C + h * 64, C, r0, T - q0, tig);
    const int i0r = q0 + r0, i1r = q0 + r1;
    const float L0 = i0r < T ? lse[((size_t)b * NH + h) * T + i0r] : 0.f;
    const float L1 = i1r < T ? lse[((size_t)b * NH + h) * T + i1r] : 0.f;
    const float D0 = i0r < T ? Dbuf[((size_t)b * NH + h) * T + i0r] : 0.f;
    const float D1 = i1r < T ? Dbuf[((size_t)b * NH + h) * T + i1r] : 0.f;
    stage_gate(Gq, mq, g, (size_t)b * T + q0, min(64, T - q0));
    __syncthreads();
    GVec gi[2], dgi[2] = {gvec_zero(), gvec_zero()};
    uint32_t mi[2];
    row_gates(gi, mi, Gq, mq, r0, r1, soft);
    float dq[8][4];
    zero_acc(dq);
    float dlam = 0.f, db = 0.f;
    const int kend = min(q0 + 64, T);
    for (int k0 = 0; k0 < kend; k0 += 64) {
        const KeyTile kt = key_tile(g, q0, k0, kend);
        const int kn = kt.n, interior = kt.interior, gated = kt.gated;
        stage_keys(Ks, Kt, Vs, NULL, Gk, mk, g, gated, base, (size_t)b * T, k0, kn, QKV,
                   C + kvh * 64, C + NKV * 64 + kvh * 64);
        float s[8][4], dp[8][4];
        mma_tile_rows(s, qa, Ks, gid, tig);  /* S = Q K^T */
        mma_tile_rows(dp, da, Vs, gid, tig); /* dP = dO V^T */
        for_query_key_pairs(
            Gk, mk, soft, gated, tig,
            [&](int nt, int e, int hf, int key, const GVec& gj, uint32_t mj) {
                const int i = hf ? i1r : i0r, j = k0 + key;
                float ds = 0.f;
                if (interior || (key < kn && i < T && j <= i)) {
                    const int far = gated && gate_far(g, i, j);
                    float aff, sneg;
                    const float gate = pair_gate(g, far, gi[hf], gj, mi[hf], mj, aff, sneg);
                    const float p = __expf(s[nt][e] * scale + gate - (hf ? L1 : L0));
                    ds = p * (dp[nt][e] - (hf ? D1 : D0));
                    if (soft && far) {
                        const float d = ds * sneg; /* d/dx of log sigmoid(x) */
                        dlam = fmaf(d, aff - g.bias, dlam);
                        db = fmaf(-d, g.lambda, db);
                        gvec_axpy(dgi[hf], d * g.lambda, gj);
                    }
                }
                s[nt][e] = ds;
            });
        mma_tile_swz(dq, s, Kt, gid, tig); /* dQ += dS K */
    }
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int i = half ? i1r : i0r;
        if (i >= T) continue;
        float* p = dqkv + ((size_t)b * T + i) * QKV + h * 64 + tig * 2;
#pragma unroll
        for (int dt = 0; dt < 8; dt++) {
            float2 v = *(float2*)(p + dt * 8);
            v.x += dq[dt][2 * half] * scale;
            v.y += dq[dt][2 * half + 1] * scale;
            *(float2*)(p + dt * 8) = v;
        }
    }
    if (soft) {
        gvec_flush(dG, dgi[0], (size_t)b * T + min(i0r, T - 1), i0r < T ? g.K : 0, tig);
        gvec_flush(dG, dgi[1], (size_t)b * T + min(i1r, T - 1), i1r < T ? g.K : 0, tig);
        if (dgate) flush_gate_params(dgate, dlam, db, red);
    }
}

/* ---- backward over key blocks: dK, dV and the column half of dG, one query head per block
 * (the heads that share a key/value head add into its rows with atomics: three times the blocks
 * of a loop over the heads, so the grid fills the GPU at small batch sizes) ---- */
__global__ void __launch_bounds__(128)
    attn_mma_bwd_dkv_kernel(float* dqkv, float* dG, const float* Dbuf, const float* dout,
                            const float* qkv, const float* lse, GateArgs g, int T, int NH, int NKV,
                            float scale) {
    __shared__ __align__(16) __nv_bfloat16 Qs[64 * MMA_LDS];
    __shared__ __align__(16) __nv_bfloat16 Qt[64 * MMA_LDS];
    __shared__ __align__(16) __nv_bfloat16 dOs[64 * MMA_LDS];
    __shared__ __align__(16) __nv_bfloat16 dOt[64 * MMA_LDS];
    __shared__ __align__(16) float Gq[64 * MMA_MAXK];
    __shared__ __align__(16) float Gk[64 * MMA_MAXK];
    __shared__ float Ls[64], Ds[64];
    __shared__ uint32_t mq[64], mk[64];
    const MmaLane ln = mma_lane();
    const int gid = ln.gid, tig = ln.tig, r0 = ln.r0, r1 = ln.r1;
    const int QKV = (NH + 2 * NKV) * 64, C = NH * 64;
    /* key tile 0 (the longest) first, across all (b, h) */
    const int nblk = (T + 63) / 64, nbh = gridDim.x / nblk;
    const int blk = (int)(blockIdx.x / nbh), bh = (int)(blockIdx.x % nbh);
    const int h = bh % NH, b = bh / NH, kvh = h / (NH / NKV);
    const int k0 = blk * 64;
    const int soft = g.mode == GATE_SOFT;
    const float* base = qkv + (size_t)b * T * QKV;
    const int j0r = k0 + r0, j1r = k0 + r1;
    uint32_t ka[4][4], va[4][4];
    afrag_global(ka, base + (size_t)k0 * QKV + C + kvh * 64, QKV, r0, T - k0, tig);
    afrag_global(va, base + (size_t)k0 * QKV + C + NKV * 64 + kvh * 64, QKV, r0, T - k0, tig);
    stage_gate(Gk, mk, g, (size_t)b * T + k0, min(64, T - k0));
    __syncthreads();
    GVec gk[2], dgk[2] = {gvec_zero(), gvec_zero()};
    uint32_t mkr[2];
    row_gates(gk, mkr, Gk, mk, r0, r1, soft);
    float dk[8][4], dv[8][4];
    zero_acc(dk);
    zero_acc(dv);
    for (int i0 = k0; i0 < T; i0 += 64) {
        const int n = min(64, T - i0);
        const int interior = i0 >= k0 + 64 && n == 64;
        const int gated = g.mode != GATE_NONE && i0 + 63 - k0 > g.w;
        __syncthreads();
        stage_tile(Qs, Qt, base + (size_t)i0 * QKV + h * 64, QKV, n);
        stage_tile(dOs, dOt, dout + ((size_t)b * T + i0) * C + h * 64, C, n);
        if (gated) stage_gate(Gq, mq, g, (size_t)b * T + i0, n);
        if ((int)threadIdx.x < 64) {
            const int x = threadIdx.x;
            Ls[x] = x < n ? lse[((size_t)b * NH + h) * T + i0 + x] : 0.f;
            Ds[x] = x < n ? Dbuf[((size_t)b * NH + h) * T + i0 + x] : 0.f;
        }
        __syncthreads();
        /* S^T and dP^T: rows are this warp's 16 keys, columns the tile's 64 queries */
        float st[8][4], dpt[8][4];
        mma_tile_rows(st, ka, Qs, gid, tig);
        mma_tile_rows(dpt, va, dOs, gid, tig);
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
#pragma unroll
            for (int e2 = 0; e2 < 2; e2++) {
                const int q = nt * 8 + tig * 2 + e2, i = i0 + q;
                const GVec gq = soft && gated ? gvec_load(Gq + q * MMA_MAXK) : gvec_zero();
                const uint32_t mqq = gated ? mq[q] : 0u;
                const float Lq = Ls[q], Dq = Ds[q];
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int e = 2 * hf + e2, j = hf ? j1r : j0r;
                    float p = 0.f, ds = 0.f;
                    if (interior || (q < n && j < T && j <= i)) {
                        const int far = gated && gate_far(g, i, j);
                        float aff, sneg;
                        const float gate = pair_gate(g, far, gq, gk[hf], mqq, mkr[hf], aff, sneg);
                        p = __expf(st[nt][e] * scale + gate - Lq);
                        ds = p * (dpt[nt][e] - Dq);
                        if (soft && far) gvec_axpy(dgk[hf], ds * sneg * g.lambda, gq);
                    }
                    st[nt][e] = p;
                    dpt[nt][e] = ds;
                }
            }
        }
        mma_tile_swz(dv, st, dOt, gid, tig); /* dV += P^T dO */
        mma_tile_swz(dk, dpt, Qt, gid, tig); /* dK += dS^T Q */
    }
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int j = half ? j1r : j0r;
        if (j >= T) continue;
        float* pk = dqkv + ((size_t)b * T + j) * QKV + C + kvh * 64 + tig * 2;
        float* pv = pk + NKV * 64;
#pragma unroll
        for (int dt = 0; dt < 8; dt++) {
            atomicAdd(pk + dt * 8, dk[dt][2 * half] * scale);
            atomicAdd(pk + dt * 8 + 1, dk[dt][2 * half + 1] * scale);
            atomicAdd(pv + dt * 8, dv[dt][2 * half]);
            atomicAdd(pv + dt * 8 + 1, dv[dt][2 * half + 1]);
        }
    }
    if (soft) {
        gvec_flush(dG, dgk[0], (size_t)b * T + min(j0r, T - 1), j0r < T ? g.K : 0, tig);
        gvec_flush(dG, dgk[1], (size_t)b * T + min(j1r, T - 1), j1r < T ? g.K : 0, tig);
    }
}

/* On by default; FOCUS_ATTN_MMA=0 in the environment, or cuda_set_attention_mma(0), turns them
 * off (training then runs on the fp32 kernels of attention.cu). */
static int g_use_mma = -1;

extern "C" void cuda_set_attention_mma(int on) { g_use_mma = on; }

extern "C" int attention_mma_applies(const AttnGate* gate, int hs) {
    if (g_use_mma < 0) {
        const char* e = getenv("FOCUS_ATTN_MMA");
        g_use_mma = !(e && !strcmp(e, "0"));
    }
    return g_use_mma && hs == 64 && (!gate || gate->mode == GATE_NONE || gate->K <= MMA_MAXK);
}

extern "C" void attention_forward_mma_cuda(float* out, float* lse, const float* qkv,
                                           const AttnGate* gate, int B, int T, int NH, int NKV) {
    unsigned grid = (unsigned)B * NH * ((T + 63) / 64);
    attn_mma_fwd_kernel<<<grid, 128>>>(out, lse, qkv, gate_args(gate), T, NH, NKV, 0.125f);
    LAUNCH_CHECK();
}

extern "C" void attention_backward_mma_cuda(float* dqkv, float* dG, float* dgate, const float* dout,
                                            const float* qkv, const float* out, const float* lse,
                                            const AttnGate* gate, int B, int T, int NH, int NKV,
                                            float* scratch) {
    GateArgs g = gate_args(gate);
    size_t warps = (size_t)B * T * NH;
    attn_rowdot_kernel<<<cdiv(warps * 32, 256), 256>>>(scratch, dout, out, B, T, NH);
    LAUNCH_CHECK();
    /* The two kernels are independent (dQ and dK/dV are disjoint columns of dqkv; dG takes
     * atomics from both): dK/dV runs on a second stream, so that each fills the other's tail. */
    static cudaStream_t side;
    static cudaEvent_t fork, join;
    if (!side) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    }
    const unsigned grid = (unsigned)B * NH * ((T + 63) / 64);
    CUDA_CHECK(cudaEventRecord(fork, 0));
    CUDA_CHECK(cudaStreamWaitEvent(side, fork, 0));
    attn_mma_bwd_dkv_kernel<<<grid, 128, 0, side>>>(dqkv, dG, scratch, dout, qkv, lse, g, T, NH,
                                                    NKV, 0.125f);
    LAUNCH_CHECK();
    attn_mma_bwd_dq_kernel<<<grid, 128>>>(dqkv, dG, dgate, scratch, dout, qkv, lse, g, T, NH, NKV,
                                          0.125f);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaEventRecord(join, side));
    CUDA_CHECK(cudaStreamWaitEvent(0, join, 0));
}
