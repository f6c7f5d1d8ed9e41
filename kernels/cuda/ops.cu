/* ops.cu: runtime set-up, cuBLAS GEMMs and the elementwise / normalisation layers on the GPU.
 * Each kernel mirrors the CPU function of the same name in kernels/cpu.c (see cuda.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
/* ---- phase timing ---- */
enum { PROF_MAX = 1 << 15 };
static cudaEvent_t g_prof_ev[PROF_MAX];
static const char* g_prof_name[PROF_MAX];
static int g_prof_n, g_prof_created, g_prof_on = -1;

extern "C" int cuda_prof_enabled(void) {
    if (g_prof_on < 0) {
        const char* e = getenv("FOCUS_PROFILE");
        g_prof_on = e && !strcmp(e, "1");
    }
    return g_prof_on;
}

extern "C" void cuda_prof_mark(const char* name) {
    if (!cuda_prof_enabled() || g_prof_n >= PROF_MAX) return;
    if (g_prof_n == g_prof_created) CUDA_CHECK(cudaEventCreate(&g_prof_ev[g_prof_created++]));
    CUDA_CHECK(cudaEventRecord(g_prof_ev[g_prof_n], 0));
    g_prof_name[g_prof_n++] = name;
}

extern "C" void cuda_prof_report(const char* title) {
    if (!cuda_prof_enabled() || g_prof_n == 0) return;
    if (!title) { /* start over without printing */
        g_prof_n = 0;
        return;
    }
    cuda_prof_mark(NULL);
    CUDA_CHECK(cudaDeviceSynchronize());
    enum { MAXN = 64 };
    const char* names[MAXN];
    double ms[MAXN], total = 0;
    int calls[MAXN], n = 0;
    for (int i = 0; i + 1 < g_prof_n; i++) {
        if (!g_prof_name[i]) continue;
        float t = 0;
        CUDA_CHECK(cudaEventElapsedTime(&t, g_prof_ev[i], g_prof_ev[i + 1]));
        int j = 0;
        while (j < n && strcmp(names[j], g_prof_name[i])) j++;
        if (j == n) {
            if (n == MAXN) continue;
            names[n] = g_prof_name[i], ms[n] = 0, calls[n] = 0, n++;
        }
        ms[j] += t, calls[j]++, total += t;
    }
    printf("profile: %s (%.2f ms in all)\n", title, total);
    for (int k = 0; k < n; k++) { /* largest first */
        int best = k;
        for (int j = k + 1; j < n; j++)
            if (ms[j] > ms[best]) best = j;
        const char* tn = names[k];
        double tm = ms[k];
        int tc = calls[k];
        names[k] = names[best], ms[k] = ms[best], calls[k] = calls[best];
        names[best] = tn, ms[best] = tm, calls[best] = tc;
        printf("  %-28s %9.3f ms %5.1f %% %6d marks\n", names[k], ms[k],
               total > 0 ? 100 * ms[k] / total : 0, calls[k]);
    }
    g_prof_n = 0;
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
/* grid.y for row loops: one row per block row, at most 65535 of them */
static unsigned rows_grid(size_t N) { return (unsigned)(N < 65535 ? N : 65535); }

/* cos / sin of every (position, frequency) pair, computed once in double as the CPU path does
 * (so the rotation matches it exactly) and kept: tab[p * half + i] = (cos, sin). */
__global__ void rope_table_kernel(float2* tab, int npos, int hs, float theta) {
    const int half = hs / 2;
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= npos * half) return;
    const int p = x / half, i = x % half;
    const double freq = pow((double)theta, -2.0 * i / hs), ang = (double)p * freq;
    tab[x] = make_float2((float)cos(ang), (float)sin(ang));
}

static const float2* rope_table(int npos, int hs, float theta) {
    static float2* tab;
    static int cap_pos, cur_hs;
    static float cur_theta;
    if (tab && npos <= cap_pos && hs == cur_hs && theta == cur_theta) return tab;
    cuda_free(tab); /* waits for kernels that still read it */
    cap_pos = npos > 4096 ? npos : 4096;
    tab = (float2*)cuda_malloc(sizeof(float2) * (size_t)cap_pos * (hs / 2));
    cur_hs = hs, cur_theta = theta;
    rope_table_kernel<<<cdiv((size_t)cap_pos * (hs / 2), 256), 256>>>(tab, cap_pos, hs, theta);
    LAUNCH_CHECK();
    return tab;
}

/* One thread per (head, frequency) of the rows blockIdx.y, + gridDim.y, ... */
__global__ void rope_kernel(float* qkv, const float2* tab, int BT, int T, int nheads, int hs,
                            int QKV, int pos0, float sign) {
    const int half = hs / 2, x = blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= nheads * half) return;
    const int h = x / half, i = x % half;
    for (int bt = blockIdx.y; bt < BT; bt += gridDim.y) {
        const float2 cs = tab[(size_t)(pos0 + bt % T) * half + i];
        const float c = cs.x, s = sign * cs.y;
        float2* v = (float2*)(qkv + (size_t)bt * QKV + h * hs + 2 * i);
        const float2 x01 = *v;
        *v = make_float2(x01.x * c - x01.y * s, x01.x * s + x01.y * c);
    }
}

static void rope_apply_cuda(float* qkv, int B, int T, int NH, int NKV, int hs, float theta,
                            int pos0, float sign) {
    const float2* tab = rope_table(pos0 + T, hs, theta);
    const int nh = NH + NKV;
    dim3 grid(cdiv((size_t)nh * (hs / 2), 128), rows_grid((size_t)B * T));
    rope_kernel<<<grid, 128>>>(qkv, tab, B * T, T, nh, hs, (NH + 2 * NKV) * hs, pos0, sign);
    LAUNCH_CHECK();
}

extern "C" void rope_forward_cuda(float* qkv, int B, int T, int NH, int NKV, int hs, float theta,
                                  int pos0) {
    rope_apply_cuda(qkv, B, T, NH, NKV, hs, theta, pos0, 1.f);
}

extern "C" void rope_backward_cuda(float* dqkv, int B, int T, int NH, int NKV, int hs, float theta,
                                   int pos0) {
    rope_apply_cuda(dqkv, B, T, NH, NKV, hs, theta, pos0, -1.f);
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

/* Rows blockIdx.y, + gridDim.y, ... (no 64-bit divisions): gate in the first F columns of a
 * row of inp, up in the next F. */
__global__ void swiglu_forward_kernel(float* out, const float* inp, size_t N, int F) {
    const int f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= F) return;
    for (size_t n = blockIdx.y; n < N; n += gridDim.y) {
        const float g = inp[n * 2 * F + f], u = inp[n * 2 * F + F + f];
        out[n * F + f] = g / (1.f + expf(-g)) * u;
    }
}

__global__ void swiglu_backward_kernel(float* dinp, const float* inp, const float* dout, size_t N,
                                       int F) {
    const int f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= F) return;
    for (size_t n = blockIdx.y; n < N; n += gridDim.y) {
        const float g = inp[n * 2 * F + f], u = inp[n * 2 * F + F + f];
        const float sig = 1.f / (1.f + expf(-g)), dy = dout[n * F + f];
        dinp[n * 2 * F + F + f] += dy * g * sig;
        dinp[n * 2 * F + f] += dy * u * sig * (1.f + g * (1.f - sig));
    }
}

extern "C" void swiglu_forward_cuda(float* out, const float* inp, size_t N, int F) {
    swiglu_forward_kernel<<<dim3(cdiv(F, 256), rows_grid(N)), 256>>>(out, inp, N, F);
    LAUNCH_CHECK();
}
extern "C" void swiglu_backward_cuda(float* dinp, const float* inp, const float* dout, size_t N,
                                     int F) {
    swiglu_backward_kernel<<<dim3(cdiv(F, 256), rows_grid(N)), 256>>>(dinp, inp, dout, N, F);
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

extern "C" void crossentropy_forward_cuda(float* losses, const float* logits, const int* targets,
                                          size_t N, int V) {
    crossentropy_kernel<<<(unsigned)N, 512>>>(losses, NULL, logits, targets, V, 0.f);
    LAUNCH_CHECK();
}

extern "C" void crossentropy_backward_cuda(float* dlogits, float* losses, const float* logits,
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
