/* objective.cu: the training objectives that target the dense model (METHOD.md section 9) on the
 * GPU, mirroring teacher_probs_forward / kl_forward / kl_backward (kernels/cpu.c),
 * attention_group_mass (kernels/attention.c) and the arithmetic of model_attn_objective
 * (model/model_cpu.c). Tested against the CPU by tests/test_cuda.c. */
#include "common.cuh"
#include "cuda.h"

extern "C" void cuda_copy(void* dst, const void* src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

/* A block per row: logits become probabilities, negent[row] = sum p log p. */
__global__ void teacher_probs_kernel(float* x, float* negent, int V) {
    __shared__ float sh[32];
    float* r = x + (size_t)blockIdx.x * V;
    const float lse = row_logsumexp(r, V, sh);
    float e = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        const float lp = r[v] - lse, p = expf(lp);
        if (p > 0.f) e += p * lp;
        r[v] = p;
    }
    e = block_sum(e, sh);
    if (threadIdx.x == 0) negent[blockIdx.x] = e;
}

extern "C" void teacher_probs_forward_cuda(float* x, float* negent, size_t N, int V) {
    if (!N) return;
    teacher_probs_kernel<<<(unsigned)N, 512>>>(x, negent, V);
    LAUNCH_CHECK();
}

/* A block per row: KL(p || softmax(logits)) = negent - sum p x + lse and, with dlogits,
 * dscale * (q - p). */
__global__ void kl_kernel(float* losses, float* dlogits, const float* logits, const float* p,
                          const float* negent, const int* targets, int V, float dscale) {
    __shared__ float sh[32];
    const size_t n = blockIdx.x;
    const float* x = logits + n * V;
    const float* pr = p + n * V;
    if (targets[n] < 0) {
        if (threadIdx.x == 0) losses[n] = 0.f;
        if (dlogits)
            for (int v = threadIdx.x; v < V; v += blockDim.x) dlogits[n * V + v] = 0.f;
        return;
    }
    float m = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, x[v]);
    m = block_max(m, sh);
    float s = 0, px = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        s += expf(x[v] - m);
        px = fmaf(pr[v], x[v], px);
    }
    s = block_sum(s, sh);
    px = block_sum(px, sh); /* its barriers also order every read of x before the writes below */
    const float lse = m + logf(s);
    if (threadIdx.x == 0) losses[n] = negent[n] - px + lse;
    if (dlogits) {
        float* d = dlogits + n * V;
        for (int v = threadIdx.x; v < V; v += blockDim.x)
            d[v] = dscale * (expf(x[v] - lse) - pr[v]);
    }
}

extern "C" void kl_forward_cuda(float* losses, const float* logits, const float* p,
                                const float* negent, const int* targets, size_t N, int V) {
    if (!N) return;
    kl_kernel<<<(unsigned)N, 512>>>(losses, NULL, logits, p, negent, targets, V, 0.f);
    LAUNCH_CHECK();
}

extern "C" void kl_backward_cuda(float* dlogits, float* losses, const float* logits, const float* p,
                                 const float* negent, const int* targets, size_t N, int V,
                                 float dscale) {
    if (!N) return;
    kl_kernel<<<(unsigned)N, 512>>>(losses, dlogits, logits, p, negent, targets, V, dscale);
    LAUNCH_CHECK();
}

/* A thread per (sequence, query, head): the query's distant keys, one at a time (threads of a
 * warp are consecutive queries of one head, so they read the same key row: a broadcast). The
 * per-head sums go to part (B, T, NH, K); heads are added in order by sum_heads_kernel, so the
 * result does not depend on timing. */
template <int HD>
__global__ void group_mass_kernel(float* part, const float* qkv, const float* lse, const float* G,
                                  int K, int w, int sinks, int B, int T, int NH, int NKV,
                                  float scale) {
    const size_t id = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (id >= (size_t)B * NH * T) return;
    const int i = (int)(id % T), h = (int)(id / T % NH), b = (int)(id / T / NH);
    const int C = NH * HD, QKV = (NH + 2 * NKV) * HD, kvh = h / (NH / NKV);
    const float* base = qkv + (size_t)b * T * QKV;
    float q[HD];
#pragma unroll
    for (int e = 0; e < HD; e++) q[e] = base[(size_t)i * QKV + h * HD + e] * scale;
    const float L = lse[((size_t)b * NH + h) * T + i];
    float acc[32];
    for (int k = 0; k < K; k++) acc[k] = 0.f;
    const float* Gb = G + (size_t)b * T * K;
    for (int j = sinks; j < i - w; j++) {
        const float* kj = base + (size_t)j * QKV + C + kvh * HD;
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < HD; e++) s = fmaf(q[e], kj[e], s);
        const float p = expf(s - L);
        for (int k = 0; k < K; k++) acc[k] = fmaf(p, Gb[(size_t)j * K + k], acc[k]);
    }
    float* o = part + (((size_t)b * T + i) * NH + h) * K;
    for (int k = 0; k < K; k++) o[k] = acc[k];
}

__global__ void sum_heads_kernel(float* mass, const float* part, size_t BT, int NH, int K) {
    const size_t id = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (id >= BT * K) return;
    const size_t bt = id / K;
    const int k = (int)(id % K);
    float s = 0.f;
    for (int h = 0; h < NH; h++) s += part[(bt * NH + h) * K + k];
    mass[id] = s;
}

extern "C" void attention_group_mass_cuda(float* mass, const float* qkv, const float* lse,
                                          const float* G, int K, int w, int sinks, int B, int T,
                                          int NH, int NKV, int hs, float* scratch) {
    if (K > 32) fatal("attention_group_mass_cuda: K=%d groups (at most 32)", K);
    const size_t n = (size_t)B * NH * T;
    const float scale = 1.f / sqrtf((float)hs);
    switch (hs) {
        case 8:
            group_mass_kernel<8>
                <<<cdiv(n, 128), 128>>>(scratch, qkv, lse, G, K, w, sinks, B, T, NH, NKV, scale);
            break;
        case 16:
            group_mass_kernel<16>
                <<<cdiv(n, 128), 128>>>(scratch, qkv, lse, G, K, w, sinks, B, T, NH, NKV, scale);
            break;
        case 32:
            group_mass_kernel<32>
                <<<cdiv(n, 128), 128>>>(scratch, qkv, lse, G, K, w, sinks, B, T, NH, NKV, scale);
            break;
        case 64:
            group_mass_kernel<64>
                <<<cdiv(n, 128), 128>>>(scratch, qkv, lse, G, K, w, sinks, B, T, NH, NKV, scale);
            break;
        case 128:
            group_mass_kernel<128>
                <<<cdiv(n, 128), 128>>>(scratch, qkv, lse, G, K, w, sinks, B, T, NH, NKV, scale);
            break;
        default:
            fatal("attention_group_mass_cuda: head size %d (8, 16, 32, 64 or 128)", hs);
    }
    LAUNCH_CHECK();
    sum_heads_kernel<<<cdiv((size_t)B * T * K, 256), 256>>>(mass, scratch, (size_t)B * T, NH, K);
    LAUNCH_CHECK();
}

/* dG = -weight * norm * t / max(G, 1e-30); per-block partial sums of -norm * t * log(max(G,
 * 1e-30)). */
__global__ void attn_objective_kernel(double* partial, float* dG, const float* t, const float* G,
                                      size_t n, double norm, float weight) {
    __shared__ double sh[256];
    double s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = fmaxf(G[i], 1e-30f);
        s -= norm * t[i] * log((double)g);
        dG[i] = (float)(-weight * norm * t[i] / g);
    }
    s = block_sum_double(s, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

extern "C" double attn_objective_cuda(float* dG, const float* t, const float* G, size_t n,
                                      double norm, float weight) {
    enum { NB = 64 };
    static double* d; /* the partial sums, allocated once */
    if (!d) d = (double*)cuda_malloc(NB * sizeof(double));
    attn_objective_kernel<<<NB, 256>>>(d, dG, t, G, n, norm, weight);
    LAUNCH_CHECK();
    double h[NB], s = 0;
    cuda_download(h, d, sizeof h);
    for (int i = 0; i < NB; i++) s += h[i]; /* fixed order: deterministic */
    return s;
}
