/* cpu.c: the reference CPU kernels (see cpu.h). BLAS does the matrix products; the rest are
 * plain loops parallelised with OpenMP over rows, deterministic for a fixed thread count. */
#include "cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <cblas.h>

void blas_check_core(char** argv) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (getenv("OPENBLAS_CORETYPE")) return; /* the caller's choice, or our re-execution */
    const char* core = openblas_get_corename();
    if (!core || strcasecmp(core, "prescott")) return;
    const char* want = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                       : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                         : NULL;
    if (!want) return;
    setenv("OPENBLAS_CORETYPE", want, 1);
    execv("/proc/self/exe", argv);
    /* no /proc: go on with the slower kernels */
#else
    (void)argv;
#endif
}

void gemm(int ta, int tb, int M, int N, int K, real alpha, const real* A, int lda, const real* B,
          int ldb, real beta, real* C, int ldc) {
    if (M == 0 || N == 0) return;
#ifdef FOCUS_DOUBLE
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

void matmul_forward(real* out, const real* inp, const real* weight, const real* bias, size_t N,
                    int IC, int OC) {
    gemm(0, 1, (int)N, OC, IC, 1, inp, IC, weight, IC, 0, out, OC);
    if (bias) {
#pragma omp parallel for
        for (size_t n = 0; n < N; n++) {
            for (int o = 0; o < OC; o++) out[n * OC + o] += bias[o];
        }
    }
}

void matmul_backward(real* dinp, real* dweight, real* dbias, const real* dout, const real* inp,
                     const real* weight, size_t N, int IC, int OC) {
    if (dinp) gemm(0, 0, (int)N, IC, OC, 1, dout, OC, weight, IC, 1, dinp, IC);
    if (dweight) gemm(1, 0, OC, IC, (int)N, 1, dout, OC, inp, IC, 1, dweight, IC);
    if (dbias) {
#pragma omp parallel for
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (size_t n = 0; n < N; n++) s += dout[n * OC + o];
            dbias[o] += (real)s;
        }
    }
}

void layernorm_forward(real* out, real* mean, real* rstd, const real* inp, const real* weight,
                       const real* bias, size_t N, int C, real eps) {
#pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const real* x = inp + n * C;
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= C;
        real s = (real)(1.0 / sqrt(v + eps));
        real* o = out + n * C;
        for (int c = 0; c < C; c++) o[c] = (real)((x[c] - m) * s) * weight[c] + bias[c];
        mean[n] = (real)m;
        rstd[n] = s;
    }
}

void layernorm_backward(real* dinp, real* dweight, real* dbias, const real* dout, const real* inp,
                        const real* weight, const real* mean, const real* rstd, size_t N, int C) {
#pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const real* x = inp + n * C;
        const real* dy = dout + n * C;
        double dnorm_mean = 0, dnorm_norm = 0;
        for (int c = 0; c < C; c++) {
            double xh = (x[c] - mean[n]) * rstd[n];
            double dn = weight[c] * dy[c];
            dnorm_mean += dn;
            dnorm_norm += dn * xh;
        }
        dnorm_mean /= C;
        dnorm_norm /= C;
        real* dx = dinp + n * C;
        for (int c = 0; c < C; c++) {
            double xh = (x[c] - mean[n]) * rstd[n];
            double dn = weight[c] * dy[c];
            dx[c] += (real)((dn - dnorm_mean - xh * dnorm_norm) * rstd[n]);
        }
    }
    if (dweight || dbias) {
        /* Weight gradients sum over rows: parallel over channels keeps it deterministic. */
#pragma omp parallel for
        for (int c = 0; c < C; c++) {
            double sw = 0, sb = 0;
            for (size_t n = 0; n < N; n++) {
                sw += (inp[n * C + c] - mean[n]) * rstd[n] * dout[n * C + c];
                sb += dout[n * C + c];
            }
            if (dweight) dweight[c] += (real)sw;
            if (dbias) dbias[c] += (real)sb;
        }
    }
}

void rmsnorm_forward(real* out, real* rstd, const real* inp, const real* weight, size_t N, int C,
                     real eps) {
#pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const real* x = inp + n * C;
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        real s = (real)(1.0 / sqrt(ss / C + eps));
        real* o = out + n * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] * s) * weight[c];
        rstd[n] = s;
    }
}

void rmsnorm_backward(real* dinp, real* dweight, const real* dout, const real* inp,
                      const real* weight, const real* rstd, size_t N, int C) {
#pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const real* x = inp + n * C;
        const real* dy = dout + n * C;
        double dot = 0;
        for (int c = 0; c < C; c++) dot += (double)weight[c] * dy[c] * x[c];
        double r = rstd[n];
        double k = dot * r * r * r / C;
        real* dx = dinp + n * C;
        for (int c = 0; c < C; c++) dx[c] += (real)(weight[c] * dy[c] * r - x[c] * k);
    }
    if (dweight) {
#pragma omp parallel for
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (size_t n = 0; n < N; n++) s += (double)inp[n * C + c] * rstd[n] * dout[n * C + c];
            dweight[c] += (real)s;
        }
    }
}

/* Rotate the q and k heads of one row (row) at position pos by +angle (sign = 1) or -angle
 * (sign = -1): the pairs (2i, 2i + 1), or with halves (i, i + hs/2). freq: theta^(-2i/hs), hs/2
 * of them. */
static void rope_row(real* row, int pos, const double* freq, int NH, int NKV, int hs, int sign,
                     int halves) {
    const int half = hs / 2, step = halves ? half : 1, stride = halves ? 1 : 2;
    for (int i = 0; i < half; i++) {
        const double ang = (double)pos * freq[i];
        const real c = (real)cos(ang), s = (real)(sign * sin(ang));
        for (int h = 0; h < NH + NKV; h++) {
            real* v = row + h * hs + stride * i;
            const real x0 = v[0], x1 = v[step];
            v[0] = x0 * c - x1 * s;
            v[step] = x0 * s + x1 * c;
        }
    }
}

/* the frequencies of rope_row (at most 1024 pairs) */
static void rope_freqs(double* freq, int hs, real theta) {
    if (hs / 2 > 1024) fatal("RoPE takes head sizes of at most 2048, not %d", hs);
    for (int i = 0; i < hs / 2; i++) freq[i] = pow((double)theta, -2.0 * i / hs);
}

/* Every row of B sequences of T, row t at position pos0 + t. */
static void rope_apply(real* qkv, int B, int T, int NH, int NKV, int hs, real theta, int pos0,
                       int sign, int halves) {
    const size_t QKV = (size_t)(NH + 2 * NKV) * hs;
    double freq[1024];
    rope_freqs(freq, hs, theta);
#pragma omp parallel for collapse(2) if ((long)B * T > 1)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            rope_row(qkv + ((size_t)b * T + t) * QKV, pos0 + t, freq, NH, NKV, hs, sign, halves);
}

/* rope_rows_table's row r */
static void rope_table_row(real* cs, int r, const int* pos, const double* freq, int hs) {
    for (int i = 0; i < hs / 2; i++) { /* rope_row's angles */
        const double ang = (double)pos[r] * freq[i];
        cs[(size_t)r * hs + 2 * i] = (real)cos(ang);
        cs[(size_t)r * hs + 2 * i + 1] = (real)sin(ang);
    }
}

void rope_rows_table(real* cs, int n, const int* pos, int hs, real theta) {
    double freq[1024];
    rope_freqs(freq, hs, theta);
    if (n == 1) { /* a decode step's row: no threads to wake (cpu.h) */
        rope_table_row(cs, 0, pos, freq, hs);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int r = 0; r < n; r++) rope_table_row(cs, r, pos, freq, hs);
}

/* rope_rows_apply's row r */
static void rope_apply_row(real* qkv, int r, const real* cs, int NH, int NKV, int hs, int halves) {
    const size_t QKV = (size_t)(NH + 2 * NKV) * hs;
    const int half = hs / 2, step = halves ? half : 1, stride = halves ? 1 : 2;
    const real* cr = cs + (size_t)r * hs;
    for (int h = 0; h < NH + NKV; h++) { /* each pair as rope_row turns it */
        real* v = qkv + (size_t)r * QKV + (size_t)h * hs;
#pragma omp simd
        for (int i = 0; i < half; i++) {
            const real c = cr[2 * i], s = cr[2 * i + 1];
            const real x0 = v[stride * i], x1 = v[stride * i + step];
            v[stride * i] = x0 * c - x1 * s;
            v[stride * i + step] = x0 * s + x1 * c;
        }
    }
}

void rope_rows_apply(real* qkv, int n, const real* cs, int NH, int NKV, int hs, int halves) {
    if (n == 1) { /* (cpu.h) */
        rope_apply_row(qkv, 0, cs, NH, NKV, hs, halves);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int r = 0; r < n; r++) rope_apply_row(qkv, r, cs, NH, NKV, hs, halves);
}

void rope_rows_forward(real* qkv, int n, const int* pos, int NH, int NKV, int hs, real theta,
                       int halves) {
    real* cs = mallocCheck(sizeof(real) * (size_t)n * hs);
    rope_rows_table(cs, n, pos, hs, theta);
    rope_rows_apply(qkv, n, cs, NH, NKV, hs, halves);
    free(cs);
}

void rope_forward(real* qkv, int B, int T, int NH, int NKV, int hs, real theta, int pos0) {
    rope_apply(qkv, B, T, NH, NKV, hs, theta, pos0, 1, 0);
}

void rope_backward(real* dqkv, int B, int T, int NH, int NKV, int hs, real theta, int pos0) {
    rope_apply(dqkv, B, T, NH, NKV, hs, theta, pos0, -1, 0);
}

void rope_halves_forward(real* qkv, int B, int T, int NH, int NKV, int hs, real theta, int pos0) {
    rope_apply(qkv, B, T, NH, NKV, hs, theta, pos0, 1, 1);
}

void rope_halves_backward(real* dqkv, int B, int T, int NH, int NKV, int hs, real theta, int pos0) {
    rope_apply(dqkv, B, T, NH, NKV, hs, theta, pos0, -1, 1);
}

void qknorm_forward(real* qkv, real* pre, real* rstd, const real* qw, const real* kw, size_t N,
                    int NH, int NKV, int hs, real eps) {
    const size_t QKV = (size_t)(NH + 2 * NKV) * hs, H = (size_t)NH + NKV;
#pragma omp parallel for
    for (size_t n = 0; n < N; n++)
        for (size_t h = 0; h < H; h++) {
            real* x = qkv + n * QKV + h * hs;
            const real* w = h < (size_t)NH ? qw : kw;
            double ss = 0;
            for (int e = 0; e < hs; e++) ss += (double)x[e] * x[e];
            const real s = (real)(1.0 / sqrt(ss / hs + eps));
            if (pre) memcpy(pre + (n * H + h) * hs, x, sizeof(real) * hs);
            for (int e = 0; e < hs; e++) x[e] = (x[e] * s) * w[e];
            if (rstd) rstd[n * H + h] = s;
        }
}

void qknorm_backward(real* dqkv, const real* pre, const real* rstd, const real* qw, const real* kw,
                     size_t N, int NH, int NKV, int hs) {
    const size_t QKV = (size_t)(NH + 2 * NKV) * hs, H = (size_t)NH + NKV;
#pragma omp parallel for
    for (size_t n = 0; n < N; n++)
        for (size_t h = 0; h < H; h++) {
            real* dy = dqkv + n * QKV + h * hs;
            const real* x = pre + (n * H + h) * hs;
            const real* w = h < (size_t)NH ? qw : kw;
            const double r = rstd[n * H + h];
            double dot = 0;
            for (int e = 0; e < hs; e++) dot += (double)w[e] * dy[e] * x[e];
            const double k = dot * r * r * r / hs;
            for (int e = 0; e < hs; e++) dy[e] = (real)(w[e] * dy[e] * r - x[e] * k);
        }
}

#define GELU_SCALE 0.7978845608028654 /* sqrt(2 / pi) */

void gelu_forward(real* out, const real* inp, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        double x = inp[i];
        out[i] = (real)(0.5 * x * (1.0 + tanh(GELU_SCALE * (x + 0.044715 * x * x * x))));
    }
}

void gelu_backward(real* dinp, const real* inp, const real* dout, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        double x = inp[i];
        double u = GELU_SCALE * (x + 0.044715 * x * x * x);
        double th = tanh(u);
        double sech2 = 1.0 - th * th;
        double g = 0.5 * (1.0 + th) + 0.5 * x * sech2 * GELU_SCALE * (1.0 + 3.0 * 0.044715 * x * x);
        dinp[i] += (real)(g * dout[i]);
    }
}

/* The activations' rows in pieces of ACT_PIECE columns over the threads (a decode step's one row
 * too); each element's arithmetic whatever piece it is in. */
enum { ACT_PIECE = 128 };

void swiglu_forward(real* out, const real* inp, size_t N, int F) {
    const size_t per = ((size_t)F + ACT_PIECE - 1) / ACT_PIECE;
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N * per; t++) {
        const size_t n = t / per;
        const int f0 = (int)(t % per) * ACT_PIECE, f1 = f0 + ACT_PIECE < F ? f0 + ACT_PIECE : F;
        const real* g = inp + n * 2 * F;
        const real* u = g + F;
#pragma omp simd
        for (int f = f0; f < f1; f++) { /* (exp_d: the C library's sigmoid, vectorised) */
            real sig = (real)(1.0 / (1.0 + exp_d(-(double)g[f])));
            out[n * F + f] = g[f] * sig * u[f];
        }
    }
}

void swiglu_backward(real* dinp, const real* inp, const real* dout, size_t N, int F) {
#pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const real* g = inp + n * 2 * F;
        const real* u = g + F;
        real* dg = dinp + n * 2 * F;
        real* du = dg + F;
        for (int f = 0; f < F; f++) {
            double sig = 1.0 / (1.0 + exp(-(double)g[f]));
            double dy = dout[n * F + f];
            du[f] += (real)(dy * g[f] * sig);
            dg[f] += (real)(dy * u[f] * sig * (1.0 + g[f] * (1.0 - sig)));
        }
    }
}

void geglu_forward(real* out, const real* inp, size_t N, int F) {
    const size_t per = ((size_t)F + ACT_PIECE - 1) / ACT_PIECE;
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N * per; t++) {
        const size_t n = t / per;
        const int f0 = (int)(t % per) * ACT_PIECE, f1 = f0 + ACT_PIECE < F ? f0 + ACT_PIECE : F;
        const real* g = inp + n * 2 * F;
        const real* u = g + F;
        for (int f = f0; f < f1; f++) {
            const double x = g[f];
            const double gl = 0.5 * x * (1.0 + tanh(GELU_SCALE * (x + 0.044715 * x * x * x)));
            out[n * F + f] = (real)(gl * u[f]);
        }
    }
}

void geglu_backward(real* dinp, const real* inp, const real* dout, size_t N, int F) {
#pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const real* g = inp + n * 2 * F;
        const real* u = g + F;
        real* dg = dinp + n * 2 * F;
        real* du = dg + F;
        for (int f = 0; f < F; f++) {
            const double x = g[f], dy = dout[n * F + f];
            const double th = tanh(GELU_SCALE * (x + 0.044715 * x * x * x));
            const double gl = 0.5 * x * (1.0 + th);
            const double d = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * GELU_SCALE *
                                                    (1.0 + 3.0 * 0.044715 * x * x);
            du[f] += (real)(dy * gl);
            dg[f] += (real)(dy * u[f] * d);
        }
    }
}

void encoder_forward(real* out, const int* tokens, const real* wte, const real* wpe, int B, int T,
                     int C) {
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            real* o = out + ((size_t)b * T + t) * C;
            const real* e = wte + (size_t)tokens[b * T + t] * C;
            for (int c = 0; c < C; c++) o[c] = e[c] + (wpe ? wpe[(size_t)t * C + c] : 0);
        }
    }
}

void encoder_backward(real* dwte, real* dwpe, const real* dout, const int* tokens, int B, int T,
                      int C) {
    /* Serial: rows with the same token add into the same embedding row. */
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const real* d = dout + ((size_t)b * T + t) * C;
            if (dwte) {
                real* w = dwte + (size_t)tokens[b * T + t] * C;
                for (int c = 0; c < C; c++) w[c] += d[c];
            }
            if (dwpe) {
                for (int c = 0; c < C; c++) dwpe[(size_t)t * C + c] += d[c];
            }
        }
    }
}

void teacher_probs_forward(real* x, real* negent, size_t N, int V) {
#pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        real* r = x + n * V;
        double m = -INFINITY, s = 0, e = 0;
        for (int v = 0; v < V; v++) m = r[v] > m ? r[v] : m;
        for (int v = 0; v < V; v++) s += exp(r[v] - m);
        double lse = m + log(s);
        for (int v = 0; v < V; v++) {
            double lp = r[v] - lse, p = exp(lp);
            if (p > 0) e += p * lp;
            r[v] = (real)p;
        }
        negent[n] = (real)e;
    }
}

static void kl_rows(real* losses, real* dlogits, const real* logits, const real* p,
                    const real* negent, const int* targets, size_t N, int V, real dscale) {
#pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const real* x = logits + n * V;
        const real* pr = p + n * V;
        if (targets[n] < 0) {
            losses[n] = 0;
            if (dlogits)
                for (int v = 0; v < V; v++) dlogits[n * V + v] = 0;
            continue;
        }
        double m = -INFINITY, s = 0, px = 0;
        for (int v = 0; v < V; v++) m = x[v] > m ? x[v] : m;
        for (int v = 0; v < V; v++) {
            s += exp(x[v] - m);
            px += (double)pr[v] * x[v];
        }
        double lse = m + log(s);
        losses[n] = (real)(negent[n] - px + lse); /* sum p (log p - x + lse) */
        if (dlogits) {
            real* d = dlogits + n * V;
            for (int v = 0; v < V; v++) d[v] = (real)(dscale * (exp(x[v] - lse) - pr[v]));
        }
    }
}

static void crossentropy_rows(real* losses, real* dlogits, const real* logits, const int* targets,
                              size_t N, int V, real dscale) {
#pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const real* x = logits + n * V;
        int tgt = targets[n];
        if (tgt < 0) { /* an unscored row: no loss, no gradient (a 262K vocabulary's exps saved) */
            losses[n] = 0;
            if (dlogits) memset(dlogits + n * V, 0, sizeof(real) * (size_t)V);
            continue;
        }
        double m = -INFINITY;
        for (int v = 0; v < V; v++) m = x[v] > m ? x[v] : m;
        double s = 0;
        for (int v = 0; v < V; v++) s += exp(x[v] - m);
        double lse = m + log(s);
        losses[n] = (real)(lse - x[tgt]);
        if (dlogits) {
            real* d = dlogits + n * V;
            for (int v = 0; v < V; v++) {
                double p = exp(x[v] - lse);
                d[v] = (real)(dscale * (p - (v == tgt)));
            }
        }
    }
}

void crossentropy_forward(real* losses, const real* logits, const int* targets, size_t N, int V) {
    crossentropy_rows(losses, NULL, logits, targets, N, V, 0);
}

void crossentropy_backward(real* dlogits, real* losses, const real* logits, const int* targets,
                           size_t N, int V, real dscale) {
    crossentropy_rows(losses, dlogits, logits, targets, N, V, dscale);
}

void kl_forward(real* losses, const real* logits, const real* p, const real* negent,
                const int* targets, size_t N, int V) {
    kl_rows(losses, NULL, logits, p, negent, targets, N, V, 0);
}

void kl_backward(real* dlogits, real* losses, const real* logits, const real* p, const real* negent,
                 const int* targets, size_t N, int V, real dscale) {
    kl_rows(losses, dlogits, logits, p, negent, targets, N, V, dscale);
}

void lora_forward(real* out, const real* x, const real* A, const real* B, size_t N, int IC, int OC,
                  int r, real scale, real* t) {
    gemm(0, 1, (int)N, r, IC, 1, x, IC, A, IC, 0, t, r);      /* t = x A^T */
    gemm(0, 1, (int)N, OC, r, scale, t, r, B, r, 1, out, OC); /* out += scale t B^T */
}

void lora_backward(real* dx, real* dA, real* dB, const real* dout, const real* x, const real* A,
                   const real* B, size_t N, int IC, int OC, int r, real scale, real* t, real* dt) {
    gemm(0, 1, (int)N, r, IC, 1, x, IC, A, IC, 0, t, r);           /* t = x A^T, again */
    gemm(1, 0, OC, r, (int)N, scale, dout, OC, t, r, 1, dB, r);    /* dB += scale dout^T t */
    gemm(0, 0, (int)N, r, OC, scale, dout, OC, B, r, 0, dt, r);    /* dt = scale dout B */
    gemm(1, 0, r, IC, (int)N, 1, dt, r, x, IC, 1, dA, IC);         /* dA += dt^T x */
    if (dx) gemm(0, 0, (int)N, IC, r, 1, dt, r, A, IC, 1, dx, IC); /* dx += dt A */
}
