/* adamw.cu: the router update on the GPU: gradient norm and scaling, AdamW (kernels/adamw.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "cuda.h"

__global__ void scale_kernel(float* x, float s, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}
extern "C" void scale_cuda(float* x, float s, size_t n) {
    scale_kernel<<<cdiv(n, 256), 256>>>(x, s, n);
    LAUNCH_CHECK();
}

__global__ void sumsq_kernel(double* out, const float* x, size_t n) {
    __shared__ double sh[256];
    double s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        s += (double)x[i] * x[i];
    s = block_sum_double(s, sh);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}

extern "C" double sumsq_cuda(const float* x, size_t n) {
    enum { NB = 64 };
    static double* d; /* the partial sums, allocated once (this runs every training step) */
    if (!d) d = (double*)cuda_malloc(NB * sizeof(double));
    sumsq_kernel<<<NB, 256>>>(d, x, n);
    LAUNCH_CHECK();
    double h[NB], s = 0;
    cuda_download(h, d, sizeof h);
    for (int i = 0; i < NB; i++) s += h[i]; /* fixed order: deterministic */
    return s;
}

/* ---- AdamW (kernels/adamw.c) ---- */
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, size_t n, float lr,
                             float b1, float b2, float eps, float wd, double c1, double c2,
                             float gs) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gi = g[i] * gs;
    m[i] = b1 * m[i] + (1 - b1) * gi;
    v[i] = b2 * v[i] + (1 - b2) * gi * gi;
    double mh = m[i] / c1, vh = v[i] / c2;
    p[i] -= (float)(lr * (mh / (sqrt(vh) + eps) + wd * p[i]));
}

extern "C" void adamw_step_cuda(float* params, const float* grads, float* m, float* v, size_t n,
                                float lr, float beta1, float beta2, float eps, float weight_decay,
                                long t, float grad_scale) {
    double c1 = 1.0 - pow(beta1, (double)t), c2 = 1.0 - pow(beta2, (double)t);
    adamw_kernel<<<cdiv(n, 256), 256>>>(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay,
                                        c1, c2, grad_scale);
    LAUNCH_CHECK();
}
