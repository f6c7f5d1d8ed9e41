/* cpu.h: the CPU kernels of the engine, one function per layer with forward and backward
 * side by side (llm.c style). Shapes use B (batch), T (time), C (channels), N (rows = B*T),
 * NH / NKV (query / key-value heads), hs (head size), V (vocabulary).
 *
 * Conventions: every *_backward ACCUMULATES (+=) into the input gradient it is given, so
 * residual branches can share one buffer. A weight gradient pointer of NULL means "frozen":
 * only the input gradient is computed, as in router-only retrofit training.
 * Tested by tests/test_gradcheck.c (finite differences, double build).
 *
 * Threads: a loop that a decode step runs once a layer for one row branches around its OpenMP
 * region rather than giving it an if clause: a region its clause keeps to one thread still makes
 * a team of one, about 0.3 us (measured with GCC 12's libgomp on the Zen 4 of docs/RESULTS.md),
 * and a sparse decode step's attention is about 50 us a layer. */
#ifndef FOCUS_CPU_H
#define FOCUS_CPU_H

#include <math.h>
#include <string.h>

#include "common.h"

/* Debian's OpenBLAS 0.3.21 takes some newer x86 CPUs (a Xeon with AVX-512 and AMX) for a
 * Prescott and runs its SSE3 kernels, about 5x slower (docs/RESULTS.md). When it has done so on a
 * CPU with AVX2 or AVX-512 and OPENBLAS_CORETYPE is not set, this re-executes the program with
 * OPENBLAS_CORETYPE naming the kernels the CPU has (SkylakeX, Haswell): the library reads it
 * when it loads. Call first in main, before any thread or file exists. Returns otherwise. */
void blas_check_core(char** argv);

/* exp for floats, vectorisable: 2^n * p(r) with r = x - n ln2 in [-ln2/2, ln2/2] and a degree-6
 * polynomial (Cephes coefficients); about 1 ulp. Returns 0 below -87.3 (and for -inf), NaN for
 * NaN, inf from about 88.4 (2^128). Written without branches, float-to-int conversions or
 * floorf (which GCC does not vectorise under the default -ftrapping-math): selects, and the
 * integers as the low bits of 1.5 2^23 + n.
 * The same values as the branching form (2^32 / 97 inputs compared). */
static inline float exp_f(float x) {
    const int nan = x != x, under = x < -87.3f;
    float y = x > 88.7f ? 88.7f : x;
    y = (nan | under) ? 0.0f : y; /* (the result is replaced below) */
    const float t = y * 1.44269504088896341f + 0.5f, big = 12582912.0f; /* 1.5 2^23 */
    float n = (t + big) - big; /* t to the nearest integer, */
    const float n1 = n - 1.0f;
    n = n > t ? n1 : n; /* then down: floor(t) */
    const float r = y - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const float nb = n + big; /* n in the low bits of the mantissa */
    int32_t ni;
    memcpy(&ni, &nb, sizeof ni);
    const int32_t u = (ni - 0x4B400000 + 127) * (1 << 23); /* 2^n */
    float s;
    memcpy(&s, &u, sizeof s);
    const float ps = p * s;
    const float e = under ? 0.0f : ps;
    return nan ? x : e;
}

/* exp for doubles, vectorisable, written as exp_f: 2^n e^r with n = floor(x / ln2 + 1/2), r = x - n
 * ln2 (ln2 in two parts, the first exact in n ln2) in [-ln2/2, ln2/2], e^r by its Taylor
 * polynomial to degree 13 (the rest below 5e-18 of it); within 2 ulp of the C library's. Returns 0
 * below -708 (where the C library's result goes subnormal), inf above 709 (it overflows at 709.78),
 * NaN for NaN: the sigmoid of a float, 1 / (1 + exp(-x)), is the same float either way. */
static inline double exp_d(double x) {
    const int nan = x != x, under = x<-708.0, over = x> 709.0;
    double y = over ? 709.0 : x;
    y = (nan | under) ? 0.0 : y; /* (the result is replaced below) */
    const double t = y * 1.4426950408889634 + 0.5, big = 6755399441055744.0; /* 1.5 2^52 */
    double n = (t + big) - big;                                              /* t rounded, */
    const double n1 = n - 1.0;
    n = n > t ? n1 : n; /* then down: floor(t) */
    const double r = (y - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10;
    double p = 1.0 / 6227020800.0; /* 1/13! */
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r * r + r + 1.0;
    const double nb = n + big; /* n in the low bits of the mantissa */
    int64_t ni;
    memcpy(&ni, &nb, sizeof ni);
    const int64_t u = (ni - 0x4338000000000000LL + 1023) * ((int64_t)1 << 52); /* 2^n */
    double s;
    memcpy(&s, &u, sizeof s);
    const double e = under ? 0.0 : over ? INFINITY : p * s;
    return nan ? x : e;
}

/* C(M,N) = alpha * op(A) op(B) + beta * C, row-major; ta/tb are 0 or 1 (transpose). */
void gemm(int ta, int tb, int M, int N, int K, real alpha, const real* A, int lda, const real* B,
          int ldb, real beta, real* C, int ldc);

/* out(N,OC) = inp(N,IC) @ weight(OC,IC)^T + bias(OC); bias may be NULL. */
void matmul_forward(real* out, const real* inp, const real* weight, const real* bias, size_t N,
                    int IC, int OC);
/* dinp += dout @ weight; dweight += dout^T @ inp and dbias += sum(dout) unless NULL. */
void matmul_backward(real* dinp, real* dweight, real* dbias, const real* dout, const real* inp,
                     const real* weight, size_t N, int IC, int OC);

/* LayerNorm (GPT-2). mean, rstd: (N) saved for the backward pass. */
void layernorm_forward(real* out, real* mean, real* rstd, const real* inp, const real* weight,
                       const real* bias, size_t N, int C, real eps);
void layernorm_backward(real* dinp, real* dweight, real* dbias, const real* dout, const real* inp,
                        const real* weight, const real* mean, const real* rstd, size_t N, int C);

/* RMSNorm (LLaMA). rstd: (N). */
void rmsnorm_forward(real* out, real* rstd, const real* inp, const real* weight, size_t N, int C,
                     real eps);
void rmsnorm_backward(real* dinp, real* dweight, const real* dout, const real* inp,
                      const real* weight, const real* rstd, size_t N, int C);

/* Rotary position embedding in place on the q and k parts of qkv (B,T,(NH+2*NKV)*hs), the
 * convention of GGUF `llama` files: adjacent pairs (2i, 2i+1) rotate by pos * theta^(-2i/hs).
 * pos0 is the position of t = 0 (non-zero in cached decoding). The backward pass applies the
 * inverse rotation to dqkv in place (the map is orthogonal). */
void rope_forward(real* qkv, int B, int T, int NH, int NKV, int hs, real theta, int pos0);
void rope_backward(real* dqkv, int B, int T, int NH, int NKV, int hs, real theta, int pos0);
/* The same rotation on half-split pairs (i, i + hs/2), the convention of GGUF files whose
 * converter did not reorder q and k rows (gemma3; ggml's NEOX mode). */
void rope_halves_forward(real* qkv, int B, int T, int NH, int NKV, int hs, real theta, int pos0);
void rope_halves_backward(real* dqkv, int B, int T, int NH, int NKV, int hs, real theta, int pos0);
/* rope_forward (halves = 0) or rope_halves_forward (1) on n rows of q k v, row r at position
 * pos[r] (the rows of a KV cache's prompt or of a batched decode step): the same values as one
 * call per row, in one parallel pass. */
void rope_rows_forward(real* qkv, int n, const int* pos, int NH, int NKV, int hs, real theta,
                       int halves);
/* The same in two steps, the angles' cosines and sines made once for every layer of one base:
 * rope_rows_table fills cs (n, hs) with row r's (cos, sin) of each pair's angle, rope_rows_apply
 * rotates by them (rope_rows_forward's values: it is the two in turn). */
void rope_rows_table(real* cs, int n, const int* pos, int hs, real theta);
void rope_rows_apply(real* qkv, int n, const real* cs, int NH, int NKV, int hs, int halves);

/* RMSNorm of every q and k head (QK-norm, Gemma 3) of qkv (N rows of (NH + 2 NKV) hs), in place:
 * q heads by qw (hs), k heads by kw (hs); the v heads are left alone. pre (N, NH + NKV, hs): the
 * heads before the norm, kept for the backward pass when not NULL; rstd (N, NH + NKV). The
 * backward pass turns d(normed heads) in dqkv into d(heads before the norm), in place. */
void qknorm_forward(real* qkv, real* pre, real* rstd, const real* qw, const real* kw, size_t N,
                    int NH, int NKV, int hs, real eps);
void qknorm_backward(real* dqkv, const real* pre, const real* rstd, const real* qw, const real* kw,
                     size_t N, int NH, int NKV, int hs);

/* A LoRA adapter on a linear layer: out (N, OC) += scale x A^T B^T with A (r, IC), B (OC, r);
 * t (N, r) is scratch. The backward pass accumulates dA, dB and (unless NULL) dx; t and dt
 * (N, r) are scratch. */
void lora_forward(real* out, const real* x, const real* A, const real* B, size_t N, int IC, int OC,
                  int r, real scale, real* t);
void lora_backward(real* dx, real* dA, real* dB, const real* dout, const real* x, const real* A,
                   const real* B, size_t N, int IC, int OC, int r, real scale, real* t, real* dt);

/* GELU, tanh approximation (GPT-2). dinp += dout * gelu'(inp). */
void gelu_forward(real* out, const real* inp, size_t n);
void gelu_backward(real* dinp, const real* inp, const real* dout, size_t n);

/* SwiGLU: inp (N, 2F) holds [gate | up]; out (N, F) = silu(gate) * up. dinp += d out / d inp. */
void swiglu_forward(real* out, const real* inp, size_t N, int F);
void swiglu_backward(real* dinp, const real* inp, const real* dout, size_t N, int F);
/* GeGLU (Gemma): out (N, F) = gelu_tanh(gate) * up, inp as for SwiGLU. */
void geglu_forward(real* out, const real* inp, size_t N, int F);
void geglu_backward(real* dinp, const real* inp, const real* dout, size_t N, int F);

/* out(B,T,C) = wte[token] (+ wpe[t] if wpe). */
void encoder_forward(real* out, const int* tokens, const real* wte, const real* wpe, int B, int T,
                     int C);
void encoder_backward(real* dwte, real* dwpe, const real* dout, const int* tokens, int B, int T,
                      int C);

/* Softmax cross-entropy per row: losses (N); targets < 0 are ignored (loss 0). The backward
 * pass computes the losses again and writes dlogits = dscale * (softmax - onehot), the gradient
 * of the loss scaled by dscale (it may alias logits: the loss's last use of them). */
void crossentropy_forward(real* losses, const real* logits, const int* targets, size_t N, int V);
void crossentropy_backward(real* dlogits, real* losses, const real* logits, const int* targets,
                           size_t N, int V, real dscale);

/* The teacher of the `kl` objective: logits (N, V) become softmax probabilities p in place, and
 * negent[n] = sum_v p log p (minus the row's entropy). */
void teacher_probs_forward(real* x, real* negent, size_t N, int V);
/* The `kl` training objective: losses[n] = KL(p_n || q_n) = negent_n - sum_v p log q, with p
 * (and negent) the teacher's (the frozen dense model's) next-token distribution and q =
 * softmax(logits) the model's; rows whose target is < 0 are ignored (loss 0). The backward pass
 * computes the losses again and writes dlogits = dscale * (q - p) (it may alias logits). */
void kl_forward(real* losses, const real* logits, const real* p, const real* negent,
                const int* targets, size_t N, int V);
void kl_backward(real* dlogits, real* losses, const real* logits, const real* p, const real* negent,
                 const int* targets, size_t N, int V, real dscale);

/* log(sigmoid(x)) = -softplus(-x), computed without overflow. */
static inline double log_sigmoid(double x) { return x < 0 ? x - log1p(exp(x)) : -log1p(exp(-x)); }

#endif
