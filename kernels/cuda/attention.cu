/* attention.cu: causal grouped-query attention with the Focus gate on the GPU, forward and
 * backward, mirroring kernels/attention.c (the gate semantics are documented in attention.h).
 *
 * Flash-style in fp32: a block takes 64 query rows (forward, dQ) or 64 key rows (dK, dV) of one
 * head, two threads per row, each holding half of the row's dimensions in registers (alternate
 * groups of 4, so the pair reads different shared-memory banks); the other side streams through
 * shared memory in tiles of 32 rows. Scores are formed, gated, exponentiated against the online
 * maximum (forward) or the saved log-sum-exp (backward) and used at once: no T x T buffer.
 * The backward pass runs two kernels, as FlashAttention-2 does: one over query blocks for dQ
 * and the row part of the gate gradient, one over key blocks for dK, dV and the column part.
 * Gate gradients reach dG by atomic adds (one per row and head), lambda and b by a block sum. */
#include "common.cuh"
#include "cuda.h"
#include "gate.cuh"
#include "rowhalf.cuh"

#define MAXK 32 /* groups */

/* The hard-gate mask of token t of a sequence (row0: its first token), 0 without one. */
__device__ __forceinline__ uint32_t token_mask(const GateArgs& g, size_t row0, int t, int valid) {
    return g.mode == GATE_HARD && valid ? g.mask[row0 + t] : 0u;
}

/* The backward pass's pair (i, j) of scaled score s (before the gate) and dP = dp: p = exp(s +
 * gate - L) and the returned dS = p (dP - D); aff receives the groups' affinity (soft gate). */
__device__ __forceinline__ float pair_ds(const GateArgs& g, int i, int j, float s, float dp,
                                         float L, float D, const float* Gi, const float* Gj,
                                         uint32_t mi, uint32_t mj, float& p, float& aff) {
    aff = 0;
    if (g.mode != GATE_NONE) s += gate_value(g, i, j, Gi, Gj, mi, mj, &aff);
    p = __expf(s - L);
    return p * (dp - D);
}

/* d loss / d x at the soft gate log sigmoid(x), x = lambda (aff - b), of a pair with dS = ds */
__device__ __forceinline__ float gate_dx(const GateArgs& g, float aff, float ds) {
    return ds / (1.f + __expf(g.lambda * (aff - g.bias)));
}

/* Between two barriers, keys k0 .. k0 + n - 1 of a sequence (base: its first qkv row, row0: its
 * first token) into shared memory: their key and value rows (columns koff and voff of qkv),
 * group vectors (soft gate) and masks (hard gate). */
template <int HD>
__device__ __forceinline__ void stage_keys(float* Ks, float* Vs, float* Gk, uint32_t* mk,
                                           const GateArgs& g, const float* base, size_t row0,
                                           int k0, int n, int QKV, int koff, int voff) {
    __syncthreads();
    load_tile<HD>(Ks, base + (size_t)k0 * QKV + koff, QKV, n);
    load_tile<HD>(Vs, base + (size_t)k0 * QKV + voff, QKV, n);
    if (g.mode == GATE_SOFT)
        for (int idx = threadIdx.x; idx < n * g.K; idx += blockDim.x)
            Gk[idx] = g.G[(row0 + k0) * g.K + idx];
    if (g.mode == GATE_HARD && (int)threadIdx.x < n)
        mk[threadIdx.x] = g.mask[row0 + k0 + threadIdx.x];
    __syncthreads();
}

template <int HD>
__global__ void __launch_bounds__(2 * ROWS)
    attn_fwd_kernel(float* out, float* lse, const float* qkv, GateArgs g, int T, int NH, int NKV,
                    float scale) {
    __shared__ __align__(16) float Ks[TILE * HD];
    __shared__ __align__(16) float Vs[TILE * HD];
    __shared__ float Gq[ROWS * MAXK], Gk[TILE * MAXK];
    __shared__ uint32_t mk[TILE];
    const int QKV = (NH + 2 * NKV) * HD, C = NH * HD, rep = NH / NKV;
    const int nblk = (T + ROWS - 1) / ROWS;
    const int blk = nblk - 1 - (int)(blockIdx.x % nblk); /* long blocks first */
    const int h = (int)(blockIdx.x / nblk) % NH, b = (int)(blockIdx.x / nblk) / NH;
    const int kvh = h / rep, q0 = blk * ROWS;
    const int r = threadIdx.x >> 1, part = threadIdx.x & 1, i = q0 + r;
    const int valid = i < T, K = g.K;
    const float* base = qkv + (size_t)b * T * QKV;
    float q[HD / 2], o[HD / 2];
    load_half<HD>(q, base + (size_t)(valid ? i : T - 1) * QKV + h * HD, part, scale);
#pragma unroll
    for (int e = 0; e < HD / 2; e++) o[e] = 0.f;
    if (g.mode == GATE_SOFT)
        for (int idx = threadIdx.x; idx < ROWS * K; idx += blockDim.x) {
            int rr = idx / K;
            Gq[idx] = q0 + rr < T ? g.G[((size_t)b * T + q0 + rr) * K + idx % K] : 0.f;
        }
    const uint32_t mi = token_mask(g, (size_t)b * T, i, valid);
    float m = -INFINITY, l = 0.f;
    const int kend = min(q0 + ROWS, T);
    for (int k0 = 0; k0 < kend; k0 += TILE) {
        int n = min(TILE, kend - k0);
        stage_keys<HD>(Ks, Vs, Gk, mk, g, base, (size_t)b * T, k0, n, QKV, C + kvh * HD,
                       C + NKV * HD + kvh * HD);
        for (int j0 = 0; j0 < n; j0 += 8)
            flash_step8<HD>(o, m, l, q, Ks, Vs, j0, n, part, [&](int jl, float x) {
                const int j = k0 + jl;
                if (j > i) return -INFINITY;
                float aff;
                if (g.mode != GATE_NONE)
                    x += gate_value(g, i, j, Gq + r * K, Gk + jl * K, mi,
                                    g.mode == GATE_HARD ? mk[jl] : 0u, &aff);
                return x;
            });
    }
    if (valid) {
        store_half<HD>(out + ((size_t)b * T + i) * C + h * HD, o, part, 1.f / l, 0);
        if (part == 0) lse[((size_t)b * NH + h) * T + i] = m + logf(l);
    }
}

/* dQ and the row half of the gate gradient; also writes D = rowsum(dO * O) to Dbuf. */
template <int HD>
__global__ void __launch_bounds__(2 * ROWS)
    attn_bwd_dq_kernel(float* dqkv, float* dG, float* dgate, float* Dbuf, const float* dout,
                       const float* qkv, const float* out, const float* lse, GateArgs g, int T,
                       int NH, int NKV, float scale) {
    __shared__ __align__(16) float Ks[TILE * HD];
    __shared__ __align__(16) float Vs[TILE * HD];
    __shared__ float Gq[ROWS * MAXK], Gk[TILE * MAXK], dGq[ROWS * MAXK];
    __shared__ uint32_t mk[TILE];
    __shared__ float red[2][32];
    const int QKV = (NH + 2 * NKV) * HD, C = NH * HD, rep = NH / NKV;
    const int nblk = (T + ROWS - 1) / ROWS;
    const int blk = (int)(blockIdx.x % nblk);
    const int h = (int)(blockIdx.x / nblk) % NH, b = (int)(blockIdx.x / nblk) / NH;
    const int kvh = h / rep, q0 = blk * ROWS;
    const int r = threadIdx.x >> 1, part = threadIdx.x & 1, i = q0 + r;
    const int valid = i < T, ic = valid ? i : T - 1, K = g.K;
    const int soft = g.mode == GATE_SOFT;
    const float* base = qkv + (size_t)b * T * QKV;
    float q[HD / 2], dO[HD / 2], dq[HD / 2], ot[HD / 2];
    load_half<HD>(q, base + (size_t)ic * QKV + h * HD, part, 1.f);
    load_half<HD>(dO, dout + ((size_t)b * T + ic) * C + h * HD, part, 1.f);
    load_half<HD>(ot, out + ((size_t)b * T + ic) * C + h * HD, part, 1.f);
    float D = 0;
#pragma unroll
    for (int e = 0; e < HD / 2; e++) D += dO[e] * ot[e], dq[e] = 0.f;
    D += __shfl_xor_sync(0xffffffffu, D, 1);
    const float L = valid ? lse[((size_t)b * NH + h) * T + i] : 0.f;
    if (valid && part == 0) Dbuf[((size_t)b * NH + h) * T + i] = D;
    if (soft)
        for (int idx = threadIdx.x; idx < ROWS * K; idx += blockDim.x) {
            int rr = idx / K;
            Gq[idx] = q0 + rr < T ? g.G[((size_t)b * T + q0 + rr) * K + idx % K] : 0.f;
            dGq[idx] = 0.f;
        }
    const uint32_t mi = token_mask(g, (size_t)b * T, i, valid);
    float dlam = 0, db = 0;
    const int kend = min(q0 + ROWS, T);
    for (int k0 = 0; k0 < kend; k0 += TILE) {
        int n = min(TILE, kend - k0);
        stage_keys<HD>(Ks, Vs, Gk, mk, g, base, (size_t)b * T, k0, n, QKV, C + kvh * HD,
                       C + NKV * HD + kvh * HD);
        for (int jl = 0; jl < n; jl++) {
            int j = k0 + jl;
            float s = dot_half<HD>(q, Ks + jl * HD, part) * scale;
            float dp = dot_half<HD>(dO, Vs + jl * HD, part);
            if (!valid || j > i) continue;
            float p, aff;
            const float ds = pair_ds(g, i, j, s, dp, L, D, Gq + r * K, Gk + jl * K, mi,
                                     g.mode == GATE_HARD ? mk[jl] : 0u, p, aff);
            axpy_half<HD>(dq, ds * scale, Ks + jl * HD, part);
            if (soft && gate_far(g, i, j)) {
                const float dx = gate_dx(g, aff, ds);
                if (part == 0) dlam += dx * (aff - g.bias), db -= dx * g.lambda;
                for (int k = part; k < K; k += 2) dGq[r * K + k] += dx * g.lambda * Gk[jl * K + k];
            }
        }
    }
    if (valid) store_half<HD>(dqkv + ((size_t)b * T + i) * QKV + h * HD, dq, part, 1.f, 1);
    if (soft) {
        __syncthreads();
        flush_gate_grads(dG, dGq, ROWS, (size_t)b * T, q0, T, K);
        if (dgate) flush_gate_params(dgate, dlam, db, red);
    }
}

/* dK, dV (all query heads sharing the key/value head) and the column half of the gate
 * gradient. */
template <int HD>
__global__ void __launch_bounds__(2 * ROWS)
    attn_bwd_dkv_kernel(float* dqkv, float* dG, const float* Dbuf, const float* dout,
                        const float* qkv, const float* lse, GateArgs g, int T, int NH, int NKV,
                        float scale) {
    __shared__ __align__(16) float Qs[TILE * HD];
    __shared__ __align__(16) float dOs[TILE * HD];
    __shared__ float Gq[TILE * MAXK], Gk[ROWS * MAXK], dGk[ROWS * MAXK];
    __shared__ float Ls[TILE], Ds[TILE];
    __shared__ uint32_t mq[TILE];
    const int QKV = (NH + 2 * NKV) * HD, C = NH * HD, rep = NH / NKV;
    const int nblk = (T + ROWS - 1) / ROWS;
    const int blk = (int)(blockIdx.x % nblk);
    const int kvh = (int)(blockIdx.x / nblk) % NKV, b = (int)(blockIdx.x / nblk) / NKV;
    const int k0 = blk * ROWS;
    const int r = threadIdx.x >> 1, part = threadIdx.x & 1, j = k0 + r;
    const int valid = j < T, jc = valid ? j : T - 1, K = g.K;
    const int soft = g.mode == GATE_SOFT;
    const float* base = qkv + (size_t)b * T * QKV;
    float kk[HD / 2], vv[HD / 2], dk[HD / 2], dv[HD / 2];
    load_half<HD>(kk, base + (size_t)jc * QKV + C + kvh * HD, part, 1.f);
    load_half<HD>(vv, base + (size_t)jc * QKV + C + NKV * HD + kvh * HD, part, 1.f);
#pragma unroll
    for (int e = 0; e < HD / 2; e++) dk[e] = dv[e] = 0.f;
    if (soft)
        for (int idx = threadIdx.x; idx < ROWS * K; idx += blockDim.x) {
            int rr = idx / K;
            Gk[idx] = k0 + rr < T ? g.G[((size_t)b * T + k0 + rr) * K + idx % K] : 0.f;
            dGk[idx] = 0.f;
        }
    const uint32_t mj = token_mask(g, (size_t)b * T, j, valid);
    for (int h = kvh * rep; h < (kvh + 1) * rep; h++) {
        for (int i0 = k0; i0 < T; i0 += TILE) {
            int n = min(TILE, T - i0);
            __syncthreads();
            load_tile<HD>(Qs, base + (size_t)i0 * QKV + h * HD, QKV, n);
            load_tile<HD>(dOs, dout + ((size_t)b * T + i0) * C + h * HD, C, n);
            if ((int)threadIdx.x < n) {
                Ls[threadIdx.x] = lse[((size_t)b * NH + h) * T + i0 + threadIdx.x];
                Ds[threadIdx.x] = Dbuf[((size_t)b * NH + h) * T + i0 + threadIdx.x];
                if (g.mode == GATE_HARD) mq[threadIdx.x] = g.mask[(size_t)b * T + i0 + threadIdx.x];
            }
            if (soft)
                for (int idx = threadIdx.x; idx < n * K; idx += blockDim.x)
                    Gq[idx] = g.G[((size_t)b * T + i0) * K + idx];
            __syncthreads();
            for (int il = 0; il < n; il++) {
                int i = i0 + il;
                float s = dot_half<HD>(kk, Qs + il * HD, part) * scale;
                float dp = dot_half<HD>(vv, dOs + il * HD, part);
                if (!valid || j > i) continue;
                float p, aff;
                const float ds = pair_ds(g, i, j, s, dp, Ls[il], Ds[il], Gq + il * K, Gk + r * K,
                                         g.mode == GATE_HARD ? mq[il] : 0u, mj, p, aff);
                axpy_half<HD>(dv, p, dOs + il * HD, part);
                axpy_half<HD>(dk, ds * scale, Qs + il * HD, part);
                if (soft && gate_far(g, i, j)) {
                    const float dx = gate_dx(g, aff, ds);
                    for (int k = part; k < K; k += 2)
                        dGk[r * K + k] += dx * g.lambda * Gq[il * K + k];
                }
            }
        }
    }
    if (valid) {
        store_half<HD>(dqkv + ((size_t)b * T + j) * QKV + C + kvh * HD, dk, part, 1.f, 1);
        store_half<HD>(dqkv + ((size_t)b * T + j) * QKV + C + NKV * HD + kvh * HD, dv, part, 1.f,
                       1);
    }
    if (soft) {
        __syncthreads();
        flush_gate_grads(dG, dGk, ROWS, (size_t)b * T, k0, T, K);
    }
}

static void check_shape(int hs, const AttnGate* g) {
    if (hs != 8 && hs != 16 && hs != 32 && hs != 64)
        fatal("CUDA attention: head size %d is not supported (8, 16, 32 or 64)", hs);
    if (g && g->mode != GATE_NONE && g->K > MAXK)
        fatal("CUDA attention: K=%d groups exceed the limit of %d", g->K, MAXK);
}

#define DISPATCH_HS(hs, KERNEL, grid, ...)               \
    switch (hs) {                                        \
        case 8:                                          \
            KERNEL<8><<<grid, 2 * ROWS>>>(__VA_ARGS__);  \
            break;                                       \
        case 16:                                         \
            KERNEL<16><<<grid, 2 * ROWS>>>(__VA_ARGS__); \
            break;                                       \
        case 32:                                         \
            KERNEL<32><<<grid, 2 * ROWS>>>(__VA_ARGS__); \
            break;                                       \
        default:                                         \
            KERNEL<64><<<grid, 2 * ROWS>>>(__VA_ARGS__); \
            break;                                       \
    }

extern "C" void attention_forward_cuda(float* out, float* lse, const float* qkv,
                                       const AttnGate* gate, int B, int T, int NH, int NKV,
                                       int hs) {
    check_shape(hs, gate);
    GateArgs g = gate_args(gate);
    unsigned grid = (unsigned)B * NH * ((T + ROWS - 1) / ROWS);
    float scale = 1.f / sqrtf((float)hs);
    DISPATCH_HS(hs, attn_fwd_kernel, grid, out, lse, qkv, g, T, NH, NKV, scale);
    LAUNCH_CHECK();
}

extern "C" void attention_backward_cuda(float* dqkv, float* dG, float* dgate, const float* dout,
                                        const float* qkv, const float* out, const float* lse,
                                        const AttnGate* gate, int B, int T, int NH, int NKV, int hs,
                                        float* scratch) {
    check_shape(hs, gate);
    GateArgs g = gate_args(gate);
    float scale = 1.f / sqrtf((float)hs);
    unsigned gq = (unsigned)B * NH * ((T + ROWS - 1) / ROWS);
    unsigned gk = (unsigned)B * NKV * ((T + ROWS - 1) / ROWS);
    DISPATCH_HS(hs, attn_bwd_dq_kernel, gq, dqkv, dG, dgate, scratch, dout, qkv, out, lse, g, T, NH,
                NKV, scale);
    LAUNCH_CHECK();
    DISPATCH_HS(hs, attn_bwd_dkv_kernel, gk, dqkv, dG, scratch, dout, qkv, lse, g, T, NH, NKV,
                scale);
    LAUNCH_CHECK();
}
