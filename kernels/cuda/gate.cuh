/* gate.cuh: the Focus gate as the attention kernels see it (attention.h has its semantics): a
 * by-value copy of AttnGate for kernel arguments, the additive gate of one pair, and the flush of
 * a block's per-row gate gradients. Shared by the fp32 kernels (attention.cu) and the tensor-core
 * ones (attention_mma.cu). */
#ifndef FOCUS_CUDA_GATE_CUH
#define FOCUS_CUDA_GATE_CUH

#include "common.cuh"
#include "cuda.h"

struct GateArgs {
    int mode, K, w;
    const float* G;
    const uint32_t* mask;
    float lambda, bias;
    int sinks;
};

static inline GateArgs gate_args(const AttnGate* g) {
    GateArgs a = {GATE_NONE, 1, 0, NULL, NULL, 0.f, 0.f, 0};
    if (g && g->mode != GATE_NONE) {
        a.mode = g->mode;
        a.K = g->K;
        a.w = g->w;
        a.G = g->G;
        a.mask = g->mask;
        a.lambda = g->lambda;
        a.bias = g->bias;
        a.sinks = g->sinks;
    }
    return a;
}

/* Pair (i, j) is gated: distant (i - j > w) and its key is not an attention sink (j >= sinks). */
__device__ __forceinline__ bool gate_far(const GateArgs& g, int i, int j) {
    return i - j > g.w && j >= g.sinks;
}

/* Additive gate of pair (i, j), given the two rows' group vectors / masks; *aff receives the
 * affinity G_i . G_j for the soft gate. Local pairs and sink keys are never gated. */
__device__ __forceinline__ float gate_value(const GateArgs& g, int i, int j, const float* Gi,
                                            const float* Gj, uint32_t mi, uint32_t mj, float* aff) {
    *aff = 0.f;
    if (g.mode == GATE_NONE || !gate_far(g, i, j)) return 0.f;
    if (g.mode == GATE_HARD) return (mi & mj) ? 0.f : -INFINITY;
    float a = 0;
    for (int k = 0; k < g.K; k++) a += Gi[k] * Gj[k];
    *aff = a;
    return log_sigmoidf_dev(g.lambda * (a - g.bias));
}

/* After a __syncthreads: adds a block's gate gradients acc (rows x K, shared memory; rows
 * r0 + rr of sequence offset bT) into dG, skipping rows at or past T and zeros. One atomic per
 * entry: the other heads (and, for the column half, the other kernel) add to the same rows. */
__device__ __forceinline__ void flush_gate_grads(float* dG, const float* acc, int rows, size_t bT,
                                                 int r0, int T, int K) {
    for (int idx = threadIdx.x; idx < rows * K; idx += blockDim.x) {
        int rr = idx / K;
        if (r0 + rr < T && acc[idx] != 0.f) atomicAdd(dG + (bT + r0 + rr) * K + idx % K, acc[idx]);
    }
}

/* dgate[0] += the block's sum of dlam, dgate[1] += of db (red: 2 x 32 floats of shared memory). */
__device__ __forceinline__ void flush_gate_params(float* dgate, float dlam, float db,
                                                  float (*red)[32]) {
    float a = block_sum(dlam, red[0]);
    float c = block_sum(db, red[1]);
    if (threadIdx.x == 0) {
        atomicAdd(dgate, a);
        atomicAdd(dgate + 1, c);
    }
}

#endif
