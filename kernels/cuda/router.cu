/* router.cu: router scores, the three routing modes and their backward passes on the GPU,
 * mirroring kernels/router.c step for step. One thread block handles one sequence: row steps run
 * a thread per token, column steps all warps over the groups (log-sum-exp over the sequence), the
 * prefix column step a warp-wide running log-sum-exp. The backward pass replays the iterates,
 * stored in caller-provided scratch, exactly as the CPU code does. Project choice: sums are in
 * float where the CPU accumulates in double (test_cuda: within 2e-6 relative at T = 200). */
#include "common.cuh"
#include "cuda.h"

#define RT 512 /* threads per sequence block */

extern "C" void router_scores_forward_cuda(float* proj, float* S, const float* h, const float* wg,
                                           const float* cent, size_t N, int C, int dg, int K) {
    gemm_cuda(0, 0, (int)N, dg, C, 1.f, h, C, wg, dg, 0.f, proj, dg);
    gemm_cuda(0, 1, (int)N, K, dg, 1.f, proj, dg, cent, dg, 0.f, S, K);
}

extern "C" void router_scores_backward_cuda(float* dh, float* dwg, float* dcent, float* dproj,
                                            const float* dS, const float* h, const float* proj,
                                            const float* wg, const float* cent, size_t N, int C,
                                            int dg, int K) {
    gemm_cuda(0, 0, (int)N, dg, K, 1.f, dS, K, cent, dg, 0.f, dproj, dg);
    if (dcent) gemm_cuda(1, 0, K, dg, (int)N, 1.f, dS, K, proj, dg, 1.f, dcent, dg);
    if (dwg) gemm_cuda(1, 0, C, dg, (int)N, 1.f, h, C, dproj, dg, 1.f, dwg, dg);
    if (dh) gemm_cuda(0, 1, (int)N, C, dg, 1.f, dproj, dg, wg, dg, 1.f, dh, C);
}

/* Every token's K entries minus their log-sum-exp. */
__device__ void row_step_dev(float* L, int T, int K) {
    for (int t = threadIdx.x; t < T; t += blockDim.x) {
        float* r = L + (size_t)t * K;
        float m = -INFINITY, s = 0;
        for (int k = 0; k < K; k++) m = fmaxf(m, r[k]);
        for (int k = 0; k < K; k++) s += expf(r[k] - m);
        float l = m + logf(s);
        for (int k = 0; k < K; k++) r[k] -= l;
    }
    __syncthreads();
}

/* The column steps share the K groups among all the block's warps: wpg warps per group (each
 * takes every wpg-th stretch of 32 tokens), their partial results combined through shared
 * memory in a fixed order; groups beyond one round (K > warps) take further rounds. */
struct ColSplit {
    int lane, wid, wpg, gpr, part, slot0; /* slot0: the group's first warp */
};

__device__ __forceinline__ ColSplit col_split(int K) {
    ColSplit c;
    const int nw = blockDim.x >> 5;
    c.lane = threadIdx.x & 31;
    c.wid = threadIdx.x >> 5;
    c.wpg = K <= nw ? nw / K : 1;
    c.gpr = nw / c.wpg; /* groups per round */
    c.part = c.wid % c.wpg;
    c.slot0 = c.wid - c.part;
    return c;
}

/* Column step: group k's entries minus their log-sum-exp over t, plus log(T/K); cum[k] (shared,
 * may be NULL) collects the subtracted offsets. */
__device__ void col_step_dev(float* L, double* cum, int T, int K) {
    __shared__ float red[32];
    const ColSplit c = col_split(K);
    const float target = logf((float)T / K);
    for (int kb = 0; kb < K; kb += c.gpr) {
        const int k = kb + c.wid / c.wpg, on = c.wid / c.wpg < c.gpr && k < K;
        float m = -INFINITY, s = 0.f;
        if (on)
            for (int t = c.part * 32 + c.lane; t < T; t += 32 * c.wpg)
                m = fmaxf(m, L[(size_t)t * K + k]);
        m = warp_max(m);
        if (c.lane == 0) red[c.wid] = m;
        __syncthreads();
        if (on) {
            for (int q = 0; q < c.wpg; q++) m = fmaxf(m, red[c.slot0 + q]);
            for (int t = c.part * 32 + c.lane; t < T; t += 32 * c.wpg)
                s += expf(L[(size_t)t * K + k] - m);
        }
        s = warp_sum(s);
        __syncthreads();
        if (c.lane == 0) red[c.wid] = s;
        __syncthreads();
        if (on) {
            s = 0.f;
            for (int q = 0; q < c.wpg; q++) s += red[c.slot0 + q];
            const float off = m + logf(s) - target;
            for (int t = c.part * 32 + c.lane; t < T; t += 32 * c.wpg) L[(size_t)t * K + k] -= off;
            if (cum && c.lane == 0 && c.part == 0) cum[k] += off;
        }
        __syncthreads();
    }
}

/* pm[t,k] = log sum_{t' <= t} exp(L[t',k]): a warp per group, 32 tokens at a time, with a
 * shuffle scan of (max, scaled sum) pairs. */
__device__ void prefix_lse_dev(float* pm, const float* L, int T, int K) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int k = wid; k < K; k += nw) {
        float carry = -INFINITY;
        for (int t0 = 0; t0 < T; t0 += 32) {
            int t = t0 + lane;
            float x = t < T ? L[(size_t)t * K + k] : -INFINITY;
            for (int o = 1; o < 32; o <<= 1) {
                float y = __shfl_up_sync(0xffffffffu, x, o);
                if (lane >= o) {
                    float hi = fmaxf(x, y);
                    x = hi == -INFINITY ? -INFINITY : hi + logf(expf(x - hi) + expf(y - hi));
                }
            }
            float hi = fmaxf(x, carry);
            x = hi == -INFINITY ? -INFINITY : hi + logf(expf(x - hi) + expf(carry - hi));
            if (t < T) pm[(size_t)t * K + k] = x;
            carry = __shfl_sync(0xffffffffu, x, 31);
        }
    }
    __syncthreads();
}

__device__ void prefix_col_step_dev(float* L, float* pm, double* cum, int T, int K) {
    prefix_lse_dev(pm, L, T, K);
    for (size_t i = threadIdx.x; i < (size_t)T * K; i += blockDim.x) {
        int t = (int)(i / K), k = (int)(i % K);
        float c = pm[i] - logf((float)(t + 1) / K);
        L[i] -= c;
        if (cum && t == T - 1) cum[k] += c;
    }
    __syncthreads();
}

/* The iterations work on W: the block's dynamic shared memory when T K floats fit there (the
 * usual case: T = 1024, K = 8 is 32 KiB), else G itself in global memory. */
__global__ void __launch_bounds__(RT)
    routing_forward_kernel(float* G, float* colofs, const float* S, const float* beta, int mode,
                           int T, int K, float tau, int iters, float* pmbuf, int in_smem) {
    extern __shared__ float smem[];
    __shared__ double cum[32];
    int b = blockIdx.x;
    const float* Sb = S + (size_t)b * T * K;
    float* Gb = G + (size_t)b * T * K;
    float* L = in_smem ? smem : Gb;
    size_t TK = (size_t)T * K;
    if (threadIdx.x < 32) cum[threadIdx.x] = 0;
    for (size_t i = threadIdx.x; i < TK; i += blockDim.x)
        L[i] = Sb[i] / tau + (mode == ROUTE_CAUSAL && beta ? beta[i % K] : 0.f);
    __syncthreads();
    if (mode == ROUTE_CAUSAL) {
        row_step_dev(L, T, K);
    } else {
        for (int it = 0; it < iters; it++) {
            if (mode == ROUTE_PREFIX)
                prefix_col_step_dev(L, pmbuf + (size_t)b * TK, cum, T, K);
            else
                col_step_dev(L, cum, T, K);
            row_step_dev(L, T, K);
        }
        if (colofs && threadIdx.x == 0) {
            double mean = 0;
            for (int k = 0; k < K; k++) mean += -cum[k];
            mean /= K;
            for (int k = 0; k < K; k++) colofs[(size_t)b * K + k] = (float)(-cum[k] - mean);
        }
    }
    for (size_t i = threadIdx.x; i < TK; i += blockDim.x) Gb[i] = expf(L[i]);
}

/* Dynamic shared memory for `bytes` of routing work if the device allows it, else 0: the kernels
 * then work in global memory. *granted: the kernel's limit as last raised (raised only when a
 * call needs more than that and the default 48 KiB, not on every layer of every step). */
static int routing_smem(const void* kernel, size_t bytes, size_t* granted) {
    static int optin = -1;
    if (optin < 0) {
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        optin -= 1024; /* the kernels' static shared memory */
    }
    if (bytes > (size_t)optin) return 0;
    if (bytes > 48 * 1024 && bytes > *granted) {
        CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
        *granted = bytes;
    }
    return 1;
}

extern "C" size_t routing_scratch_floats(int B, int T, int K, int iters) {
    return (size_t)B * T * K * (2 * (size_t)iters + 5);
}

extern "C" void routing_forward_cuda(float* G, float* colofs, const float* S, const float* beta,
                                     Routing mode, int B, int T, int K, float tau, int iters) {
    /* prefix lse scratch, grown as needed and kept: this runs for every layer of every step */
    static float* pm;
    static size_t cap;
    size_t need = mode == ROUTE_PREFIX ? (size_t)B * T * K : 0;
    if (need > cap) {
        cuda_free(pm); /* waits for earlier kernels that used it */
        pm = (float*)cuda_malloc(sizeof(float) * need);
        cap = need;
    }
    static size_t granted;
    const size_t bytes = sizeof(float) * T * K;
    const int in_smem = routing_smem((const void*)routing_forward_kernel, bytes, &granted);
    routing_forward_kernel<<<B, RT, in_smem ? bytes : 0>>>(
        G, colofs, S, beta, (int)mode, T, K, tau, iters, mode == ROUTE_PREFIX ? pm : NULL, in_smem);
    LAUNCH_CHECK();
}

__device__ void row_step_backward_dev(float* d, const float* Lpost, int T, int K) {
    for (int t = threadIdx.x; t < T; t += blockDim.x) {
        float s = 0;
        for (int k = 0; k < K; k++) s += d[(size_t)t * K + k];
        for (int k = 0; k < K; k++) d[(size_t)t * K + k] -= expf(Lpost[(size_t)t * K + k]) * s;
    }
    __syncthreads();
}

__device__ void col_step_backward_dev(float* d, const float* Lpost, int T, int K) {
    __shared__ float red[32];
    const ColSplit c = col_split(K);
    for (int kb = 0; kb < K; kb += c.gpr) {
        const int k = kb + c.wid / c.wpg, on = c.wid / c.wpg < c.gpr && k < K;
        float s = 0.f;
        if (on)
            for (int t = c.part * 32 + c.lane; t < T; t += 32 * c.wpg) s += d[(size_t)t * K + k];
        s = warp_sum(s);
        if (c.lane == 0) red[c.wid] = s;
        __syncthreads();
        if (on) {
            s = 0.f;
            for (int q = 0; q < c.wpg; q++) s += red[c.slot0 + q];
            for (int t = c.part * 32 + c.lane; t < T; t += 32 * c.wpg)
                d[(size_t)t * K + k] -= expf(Lpost[(size_t)t * K + k]) * K / T * s;
        }
        __syncthreads();
    }
}

/* The suffix recurrence of prefix_col_backward (kernels/router.c): a thread per group. */
__device__ void prefix_col_backward_dev(float* d, const float* Lpre, float* pm, int T, int K) {
    prefix_lse_dev(pm, Lpre, T, K);
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
        float A = 0;
        for (int t = T - 1; t >= 0; t--) {
            size_t at = (size_t)t * K + k;
            float next = (t + 1 < T) ? expf(pm[at] - pm[at + K]) * A : 0.f;
            A = d[at] + next;
            d[at] -= expf(Lpre[at] - pm[at]) * A;
        }
    }
    __syncthreads();
}

__device__ void copy_dev(float* dst, const float* src, size_t n) {
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
    __syncthreads();
}

/* The forward iterations are replayed on W and each iterate stored to scratch; the backward
 * steps then run on d, with the iterate each needs copied back into W. W and d are the block's
 * dynamic shared memory when 2 T K floats fit there, else scratch in global memory. */
__global__ void __launch_bounds__(RT)
    routing_backward_kernel(float* dS, const float* dG, const float* S, const float* G,
                            const float* beta, int mode, int T, int K, float tau, int iters,
                            float* scratch, int in_smem) {
    extern __shared__ float smem[];
    int b = blockIdx.x;
    const size_t TK = (size_t)T * K;
    const int nit = mode == ROUTE_CAUSAL ? 0 : iters;
    float* base = scratch + (size_t)b * TK * (2 * (size_t)iters + 5);
    float* Ls = base; /* 2 * nit + 2 iterates */
    float* pm = base + (2 * (size_t)iters + 2) * TK;
    float* W = in_smem ? smem : pm + TK;
    float* d = in_smem ? smem + TK : pm + 2 * TK;
    const float* Sb = S + b * TK;
    for (size_t i = threadIdx.x; i < TK; i += blockDim.x)
        W[i] = Sb[i] / tau + (mode == ROUTE_CAUSAL && beta ? beta[i % K] : 0.f);
    __syncthreads();
    copy_dev(Ls, W, TK);
    for (int it = 0; it < nit; it++) {
        if (mode == ROUTE_PREFIX)
            prefix_col_step_dev(W, pm, NULL, T, K);
        else
            col_step_dev(W, NULL, T, K);
        copy_dev(Ls + (2 * it + 1) * TK, W, TK);
        row_step_dev(W, T, K);
        copy_dev(Ls + (2 * it + 2) * TK, W, TK);
    }
    if (mode == ROUTE_CAUSAL) {
        row_step_dev(W, T, K);
        copy_dev(Ls + TK, W, TK);
    }
    /* W now holds the last iterate */
    const float* Gb = G + b * TK;
    for (size_t i = threadIdx.x; i < TK; i += blockDim.x) d[i] = dG[b * TK + i] * Gb[i];
    __syncthreads();
    if (mode == ROUTE_CAUSAL) {
        row_step_backward_dev(d, W, T, K);
    } else {
        for (int it = nit - 1; it >= 0; it--) {
            if (it < nit - 1) copy_dev(W, Ls + (2 * it + 2) * TK, TK);
            row_step_backward_dev(d, W, T, K);
            if (mode == ROUTE_PREFIX) {
                copy_dev(W, Ls + 2 * it * TK, TK);
                prefix_col_backward_dev(d, W, pm, T, K);
            } else {
                copy_dev(W, Ls + (2 * it + 1) * TK, TK);
                col_step_backward_dev(d, W, T, K);
            }
        }
    }
    for (size_t i = threadIdx.x; i < TK; i += blockDim.x) dS[b * TK + i] += d[i] / tau;
}

extern "C" void routing_backward_cuda(float* dS, const float* dG, const float* S, const float* G,
                                      const float* beta, Routing mode, int B, int T, int K,
                                      float tau, int iters, float* scratch) {
    static size_t granted;
    const size_t bytes = 2 * sizeof(float) * T * K;
    const int in_smem = routing_smem((const void*)routing_backward_kernel, bytes, &granted);
    routing_backward_kernel<<<B, RT, in_smem ? bytes : 0>>>(dS, dG, S, G, beta, (int)mode, T, K,
                                                            tau, iters, scratch, in_smem);
    LAUNCH_CHECK();
}

/* A thread per token: routing_topk_mask of kernels/router.c. */
__global__ void topk_mask_kernel(uint32_t* mask, const float* G, int B, int T, int K, int topk,
                                 float topp, int sinks, int pos0) {
    size_t n = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (n >= (size_t)B * T) return;
    mask[n] = topk_mask_row(G + n * K, K, topk, topp, pos0 + (int)(n % (size_t)T), sinks);
}

extern "C" void routing_topk_mask_cuda(uint32_t* mask, const float* G, int B, int T, int K,
                                       int topk, float topp, int sinks, int pos0) {
    topk_mask_kernel<<<cdiv((size_t)B * T, 256), 256>>>(mask, G, B, T, K, topk, topp, sinks, pos0);
    LAUNCH_CHECK();
}
