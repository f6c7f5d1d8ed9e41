/* ops.cu: runtime set-up, cuBLAS GEMMs and the elementwise / normalisation layers on the GPU.
 * Each kernel mirrors the CPU function of the same name in kernels/cpu.c (see cuda.h). */
#include <stdio.h>

#include "common.cuh"
#include "cuda.h"

static cublasHandle_t g_cublas;
static int g_ready, g_tf32 = 1;
static char g_name[400];

cublasHandle_t focus_cublas(void) {
    if (!g_ready) cuda_init(1);
    return g_cublas;
}

extern "C" int cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0;
}

extern "C" void cuda_init(int quiet) {
    if (g_ready) return;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        fatal("--device cuda: no usable CUDA device (%s)",
              e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    CUDA_CHECK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    snprintf(g_name, sizeof g_name, "%.256s (sm_%d%d, %d SMs, %.0f GiB)", prop.name, prop.major,
             prop.minor, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
    CUBLAS_CHECK(cublasCreate(&g_cublas));
    CUBLAS_CHECK(
        cublasSetMathMode(g_cublas, g_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH));
    g_ready = 1;
    if (!quiet) printf("device: %s\n", g_name);
}

extern "C" const char* cuda_device_name(void) { return g_name; }

extern "C" void cuda_set_tf32(int on) {
    g_tf32 = on;
    if (g_ready)
        CUBLAS_CHECK(
            cublasSetMathMode(g_cublas, on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH));
}

extern "C" void* cuda_malloc(size_t bytes) {
    void* p = NULL;
    if (bytes == 0) bytes = 16;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess)
        fatal("GPU memory: cannot allocate %.1f MiB (%s)", bytes / 1048576.0,
              cudaGetErrorString(e));
    return p;
}

extern "C" void cuda_free(void* p) {
    if (p) CUDA_CHECK(cudaFree(p));
}
extern "C" void cuda_upload(void* dst, const void* src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
extern "C" void cuda_download(void* dst, const void* src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
extern "C" void cuda_memset0(void* p, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes));
}
extern "C" void cuda_sync(void) {
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
}

/* Row-major C = alpha op(A) op(B) + beta C is column-major C^T = op(B)^T op(A)^T. */
extern "C" void gemm_cuda(int ta, int tb, int M, int N, int K, float alpha, const float* A, int lda,
                          const float* B, int ldb, float beta, float* C, int ldc) {
    if (M == 0 || N == 0) return;
    CUBLAS_CHECK(cublasSgemm(focus_cublas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                             ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb, A, lda, &beta,
                             C, ldc));
}

__global__ void bias_rows_kernel(float* out, const float* bias, size_t N, int OC) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < N * OC) out[i] = bias[i % OC];
}

extern "C" void matmul_forward_cuda(float* out, const float* inp, const float* weight,
                                    const float* bias, size_t N, int IC, int OC) {
    if (bias) {
        bias_rows_kernel<<<cdiv(N * OC, 256), 256>>>(out, bias, N, OC);
        LAUNCH_CHECK();
    }
    gemm_cuda(0, 1, (int)N, OC, IC, 1.f, inp, IC, weight, IC, bias ? 1.f : 0.f, out, OC);
}

/* dbias[c] += sum_n dout[n, c]: one block per 32 columns, deterministic. */
__global__ void colsum_kernel(float* dbias, const float* dout, size_t N, int OC) {
    __shared__ float part[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0;
    if (c < OC)
        for (size_t n = threadIdx.y; n < N; n += 8) s += dout[n * OC + c];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        for (int y = 1; y < 8; y++) s += part[y][threadIdx.x];
        dbias[c] += s;
    }
}

extern "C" void matmul_backward_cuda(float* dinp, float* dweight, float* dbias, const float* dout,
                                     const float* inp, const float* weight, size_t N, int IC,
                                     int OC) {
    if (dinp) gemm_cuda(0, 0, (int)N, IC, OC, 1.f, dout, OC, weight, IC, 1.f, dinp, IC);
    if (dweight) gemm_cuda(1, 0, OC, IC, (int)N, 1.f, dout, OC, inp, IC, 1.f, dweight, IC);
    if (dbias) {
        colsum_kernel<<<cdiv(OC, 32), dim3(32, 8)>>>(dbias, dout, N, OC);
        LAUNCH_CHECK();
    }
}

/* ---- normalisation: one block of 256 threads per row ---- */
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* w, const float* b, int C, float eps) {
    __shared__ float sh[32];
    size_t n = blockIdx.x;
    const float* x = inp + n * C;
    float s = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) s += x[c];
    float m = block_sum(s, sh) / C;
    float v = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) v += (x[c] - m) * (x[c] - m);
    v = block_sum(v, sh) / C;
    float r = rsqrtf(v + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        out[n * C + c] = (x[c] - m) * r * w[c] + (b ? b[c] : 0.f);
    if (threadIdx.x == 0) {
        mean[n] = m;
        rstd[n] = r;
    }
}

extern "C" void layernorm_forward_cuda(float* out, float* mean, float* rstd, const float* inp,
                                       const float* weight, const float* bias, size_t N, int C,
                                       float eps) {
    layernorm_forward_kernel<<<(unsigned)N, 256>>>(out, mean, rstd, inp, weight, bias, C, eps);
    LAUNCH_CHECK();
}

__global__ void layernorm_backward_kernel(float* dinp, const float* dout, const float* inp,
                                          const float* w, const float* mean, const float* rstd,
                                          int C) {
    __shared__ float sh[32];
    size_t n = blockIdx.x;
    const float *x = inp + n * C, *dy = dout + n * C;
    float m = mean[n], r = rstd[n], s1 = 0, s2 = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float dn = w[c] * dy[c];
        s1 += dn;
        s2 += dn * (x[c] - m) * r;
    }
    s1 = block_sum(s1, sh) / C;
    s2 = block_sum(s2, sh) / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float xh = (x[c] - m) * r;
        dinp[n * C + c] += (w[c] * dy[c] - s1 - xh * s2) * r;
    }
}

/* dweight[c] += sum_n xhat * dout, dbias[c] += sum_n dout (rstd / mean per row; mean NULL for
 * RMSNorm). */
__global__ void norm_wgrad_kernel(float* dw, float* db, const float* dout, const float* inp,
                                  const float* mean, const float* rstd, size_t N, int C) {
    __shared__ float pw[8][33], pb[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float sw = 0, sb = 0;
    if (c < C) {
        for (size_t n = threadIdx.y; n < N; n += 8) {
            float xh = (inp[n * C + c] - (mean ? mean[n] : 0.f)) * rstd[n];
            sw += xh * dout[n * C + c];
            sb += dout[n * C + c];
        }
    }
    pw[threadIdx.y][threadIdx.x] = sw;
    pb[threadIdx.y][threadIdx.x] = sb;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int y = 1; y < 8; y++) sw += pw[y][threadIdx.x], sb += pb[y][threadIdx.x];
        if (dw) dw[c] += sw;
        if (db) db[c] += sb;
    }
}

extern "C" void layernorm_backward_cuda(float* dinp, float* dweight, float* dbias,
                                        const float* dout, const float* inp, const float* weight,
                                        const float* mean, const float* rstd, size_t N, int C) {
    layernorm_backward_kernel<<<(unsigned)N, 256>>>(dinp, dout, inp, weight, mean, rstd, C);
    LAUNCH_CHECK();
    if (dweight || dbias) {
        norm_wgrad_kernel<<<cdiv(C, 32), dim3(32, 8)>>>(dweight, dbias, dout, inp, mean, rstd, N,
                                                        C);
        LAUNCH_CHECK();
    }
}

__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp, const float* w,
                                       int C, float eps) {
    __shared__ float sh[32];
    size_t n = blockIdx.x;
    const float* x = inp + n * C;
    float s = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) s += x[c] * x[c];
    float r = rsqrtf(block_sum(s, sh) / C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) out[n * C + c] = (x[c] * r) * w[c];
    if (threadIdx.x == 0) rstd[n] = r;
}

extern "C" void rmsnorm_forward_cuda(float* out, float* rstd, const float* inp, const float* weight,
                                     size_t N, int C, float eps) {
    rmsnorm_forward_kernel<<<(unsigned)N, 256>>>(out, rstd, inp, weight, C, eps);
    LAUNCH_CHECK();
}

__global__ void rmsnorm_backward_kernel(float* dinp, const float* dout, const float* inp,
                                        const float* w, const float* rstd, int C) {
    __shared__ float sh[32];
    size_t n = blockIdx.x;
    const float *x = inp + n * C, *dy = dout + n * C;
    float dot = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += w[c] * dy[c] * x[c];
    dot = block_sum(dot, sh);
    float r = rstd[n], k = dot * r * r * r / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dinp[n * C + c] += w[c] * dy[c] * r - x[c] * k;
}

extern "C" void rmsnorm_backward_cuda(float* dinp, float* dweight, const float* dout,
                                      const float* inp, const float* weight, const float* rstd,
                                      size_t N, int C) {
    rmsnorm_backward_kernel<<<(unsigned)N, 256>>>(dinp, dout, inp, weight, rstd, C);
    LAUNCH_CHECK();
    if (dweight) {
        norm_wgrad_kernel<<<cdiv(C, 32), dim3(32, 8)>>>(dweight, NULL, dout, inp, NULL, rstd, N, C);
        LAUNCH_CHECK();
    }
}

/* ---- RoPE: one thread per (row, pair), over the q and k heads ---- */
__global__ void rope_kernel(float* qkv, int BT, int T, int NH, int NKV, int hs, float theta,
                            int pos0, float sign) {
    int half = hs / 2, QKV = (NH + 2 * NKV) * hs;
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t total = (size_t)BT * (NH + NKV) * half;
    if (idx >= total) return;
    int i = (int)(idx % half);
    int h = (int)((idx / half) % (NH + NKV));
    size_t bt = idx / ((size_t)half * (NH + NKV));
    int t = (int)(bt % T);
    double freq = pow((double)theta, -2.0 * i / hs);
    double ang = (double)(pos0 + t) * freq;
    float c = (float)cos(ang), s = sign * (float)sin(ang);
    float* v = qkv + bt * QKV + h * hs + 2 * i;
    float x0 = v[0], x1 = v[1];
    v[0] = x0 * c - x1 * s;
    v[1] = x0 * s + x1 * c;
}

extern "C" void rope_forward_cuda(float* qkv, int B, int T, int NH, int NKV, int hs, float theta,
                                  int pos0) {
    size_t total = (size_t)B * T * (NH + NKV) * (hs / 2);
    rope_kernel<<<cdiv(total, 256), 256>>>(qkv, B * T, T, NH, NKV, hs, theta, pos0, 1.f);
    LAUNCH_CHECK();
}

extern "C" void rope_backward_cuda(float* dqkv, int B, int T, int NH, int NKV, int hs, float theta,
                                   int pos0) {
    size_t total = (size_t)B * T * (NH + NKV) * (hs / 2);
    rope_kernel<<<cdiv(total, 256), 256>>>(dqkv, B * T, T, NH, NKV, hs, theta, pos0, -1.f);
    LAUNCH_CHECK();
}

/* ---- activations ---- */
#define GELU_SCALE 0.7978845608028654f

__global__ void gelu_forward_kernel(float* out, const float* inp, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i];
    out[i] = 0.5f * x * (1.f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x)));
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i];
    float th = tanhf(GELU_SCALE * (x + 0.044715f * x * x * x));
    float g = 0.5f * (1.f + th) +
              0.5f * x * (1.f - th * th) * GELU_SCALE * (1.f + 3.f * 0.044715f * x * x);
    dinp[i] += g * dout[i];
}

extern "C" void gelu_forward_cuda(float* out, const float* inp, size_t n) {
    gelu_forward_kernel<<<cdiv(n, 256), 256>>>(out, inp, n);
    LAUNCH_CHECK();
}
extern "C" void gelu_backward_cuda(float* dinp, const float* inp, const float* dout, size_t n) {
    gelu_backward_kernel<<<cdiv(n, 256), 256>>>(dinp, inp, dout, n);
    LAUNCH_CHECK();
}

__global__ void swiglu_forward_kernel(float* out, const float* inp, size_t N, int F) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= N * F) return;
    size_t n = i / F;
    int f = (int)(i % F);
    float g = inp[n * 2 * F + f], u = inp[n * 2 * F + F + f];
    out[i] = g / (1.f + expf(-g)) * u;
}

__global__ void swiglu_backward_kernel(float* dinp, const float* inp, const float* dout, size_t N,
                                       int F) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= N * F) return;
    size_t n = i / F;
    int f = (int)(i % F);
    float g = inp[n * 2 * F + f], u = inp[n * 2 * F + F + f];
    float sig = 1.f / (1.f + expf(-g)), dy = dout[i];
    dinp[n * 2 * F + F + f] = dy * g * sig;
    dinp[n * 2 * F + f] = dy * u * sig * (1.f + g * (1.f - sig));
}

extern "C" void swiglu_forward_cuda(float* out, const float* inp, size_t N, int F) {
    swiglu_forward_kernel<<<cdiv(N * F, 256), 256>>>(out, inp, N, F);
    LAUNCH_CHECK();
}
extern "C" void swiglu_backward_cuda(float* dinp, const float* inp, const float* dout, size_t N,
                                     int F) {
    swiglu_backward_kernel<<<cdiv(N * F, 256), 256>>>(dinp, inp, dout, N, F);
    LAUNCH_CHECK();
}

__global__ void encoder_forward_kernel(float* out, const int* tokens, const float* wte,
                                       const float* wpe, int T, int C, size_t total) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t bt = i / C;
    int c = (int)(i % C), t = (int)(bt % T);
    out[i] = wte[(size_t)tokens[bt] * C + c] + (wpe ? wpe[(size_t)t * C + c] : 0.f);
}

extern "C" void encoder_forward_cuda(float* out, const int* tokens, const float* wte,
                                     const float* wpe, int B, int T, int C) {
    size_t total = (size_t)B * T * C;
    encoder_forward_kernel<<<cdiv(total, 256), 256>>>(out, tokens, wte, wpe, T, C, total);
    LAUNCH_CHECK();
}

/* One block per row: max, sum of exp, loss, and the gradient in place if asked. */
__global__ void crossentropy_kernel(float* losses, float* dlogits, const float* logits,
                                    const int* targets, int V, float dscale) {
    __shared__ float sh[32];
    size_t n = blockIdx.x;
    const float* x = logits + n * V;
    float m = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, x[v]);
    m = block_max(m, sh);
    float s = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(x[v] - m);
    s = block_sum(s, sh);
    float lse = m + logf(s);
    int tgt = targets[n];
    float xt = tgt >= 0 ? x[tgt] : 0.f;
    __syncthreads(); /* every thread has read x[tgt] before dlogits (which may alias) is written */
    if (threadIdx.x == 0) losses[n] = tgt >= 0 ? lse - xt : 0.f;
    if (dlogits) {
        float* d = dlogits + n * V;
        for (int v = threadIdx.x; v < V; v += blockDim.x) {
            float p = tgt >= 0 ? expf(x[v] - lse) : 0.f;
            d[v] = dscale * (p - (v == tgt ? 1.f : 0.f));
        }
    }
}

extern "C" void crossentropy_forward_cuda(float* losses, float* dlogits, const float* logits,
                                          const int* targets, size_t N, int V, float dscale) {
    crossentropy_kernel<<<(unsigned)N, 512>>>(losses, dlogits, logits, targets, V, dscale);
    LAUNCH_CHECK();
}

__global__ void residual_add_kernel(float* y, const float* x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}
extern "C" void residual_add_cuda(float* y, const float* x, size_t n) {
    residual_add_kernel<<<cdiv(n, 256), 256>>>(y, x, n);
    LAUNCH_CHECK();
}

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
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k) sh[threadIdx.x] += sh[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = sh[0];
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

/* ---- AdamW (train/optim.c) ---- */
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

__global__ void f2bf_kernel(uint16_t* dst, const float* src, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned u = __float_as_uint(src[i]);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    dst[i] = (uint16_t)(u >> 16);
}

extern "C" void float_to_bf16_cuda(uint16_t* dst, const float* src, size_t n) {
    f2bf_kernel<<<cdiv(n, 256), 256>>>(dst, src, n);
    LAUNCH_CHECK();
}

/* ---- benchmark inputs ---- */
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void fill_normal_bf16_kernel(uint16_t* x, size_t n, uint64_t seed) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint64_t r = mix64(seed ^ mix64(i));
    float u1 = ((r >> 40) + 1) * (1.f / 16777217.f),
          u2 = ((r >> 16) & 0xffffff) * (1.f / 16777216.f);
    float z = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    unsigned u = __float_as_uint(z);
    u += 0x7fffu + ((u >> 16) & 1u);
    x[i] = (uint16_t)(u >> 16);
}

extern "C" void cuda_fill_normal_bf16(uint16_t* x, size_t n, uint64_t seed) {
    fill_normal_bf16_kernel<<<cdiv(n, 256), 256>>>(x, n, seed);
    LAUNCH_CHECK();
}

__global__ void random_masks_kernel(uint32_t* mask, size_t n, int K, int topk, uint64_t seed) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint64_t r = mix64(seed ^ mix64(i));
    uint32_t m = 0;
    while (__popc(m) < topk) {
        m |= 1u << (r % (uint64_t)K);
        r = mix64(r);
    }
    mask[i] = m;
}

extern "C" void cuda_random_masks(uint32_t* mask, size_t n, int K, int topk, uint64_t seed) {
    random_masks_kernel<<<cdiv(n, 256), 256>>>(mask, n, K, topk, seed);
    LAUNCH_CHECK();
}
