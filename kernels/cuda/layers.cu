/* layers.cu: the normalisation, RoPE, activation, embedding, cross-entropy and residual layers on
 * the GPU. Each kernel mirrors the CPU function of the same name in kernels/cpu.c (see cuda.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "cuda.h"

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
    float lse = row_logsumexp(x, V, sh);
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
