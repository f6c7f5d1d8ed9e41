/* attention.c: reference causal attention with the Focus gate, forward and backward.
 *
 * Work is split into tasks of BQ query rows of one sequence. A task computes the gate block
 * (BQ x n, n = keys up to the block's last row) once and shares it among all heads, since the
 * gate is per layer, not per head. Each head's scores come from one BLAS product. The backward
 * pass recomputes scores and probabilities from lse; key/value and group gradients go to
 * per-thread buffers that are summed in thread order, so results do not depend on timing. */
#include "attention.h"

#include <math.h>
#include <string.h>

#include <omp.h>

#include "cpu.h"

#define BQ 64

/* Fill gt (nq x n) with the additive gate for rows i0..i0+nq-1 of sequence b; if aff is
 * non-NULL it receives the affinities a_ij (soft gate only). Entries for local pairs are 0. */
static void gate_block(real* gt, real* aff, const AttnGate* g, int b, int T, int i0, int nq,
                       int n) {
    if (g->mode == GATE_SOFT) {
        const real* Gb = g->G + (size_t)b * T * g->K;
        real* a = aff ? aff : gt;
        gemm(0, 1, nq, n, g->K, 1, Gb + (size_t)i0 * g->K, g->K, Gb, g->K, 0, a, n);
        for (int r = 0; r < nq; r++) {
            int far = i0 + r - g->w; /* sinks <= j < far is a distant pair */
            for (int j = 0; j < n; j++) {
                size_t at = (size_t)r * n + j;
                gt[at] =
                    j < far && j >= g->sinks ? (real)log_sigmoid(g->lambda * (a[at] - g->bias)) : 0;
            }
        }
    } else {
        const uint32_t* mb = g->mask + (size_t)b * T;
        for (int r = 0; r < nq; r++) {
            int far = i0 + r - g->w;
            uint32_t mi = mb[i0 + r];
            for (int j = 0; j < n; j++) {
                gt[(size_t)r * n + j] = (j < far && j >= g->sinks && !(mi & mb[j])) ? -INFINITY : 0;
            }
        }
    }
}

void attention_forward(real* out, real* lse, const real* qkv, const AttnGate* gate, int B, int T,
                       int NH, int NKV, int hs) {
    const int C = NH * hs, QKV = (NH + 2 * NKV) * hs, rep = NH / NKV;
    const int nblk = (T + BQ - 1) / BQ;
    const real scale = (real)(1.0 / sqrt((double)hs));
    const int gated = gate && gate->mode != GATE_NONE;
#pragma omp parallel
    {
        real* S = mallocCheck(sizeof(real) * BQ * T);
        real* gt = gated ? mallocCheck(sizeof(real) * BQ * T) : NULL;
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < B * nblk; task++) {
            int b = task / nblk, blk = nblk - 1 - task % nblk; /* longest blocks first */
            int i0 = blk * BQ, nq = (T - i0 < BQ) ? T - i0 : BQ, n = i0 + nq;
            const real* base = qkv + (size_t)b * T * QKV;
            if (gated) gate_block(gt, NULL, gate, b, T, i0, nq, n);
            for (int h = 0; h < NH; h++) {
                int kvh = h / rep;
                const real* q = base + (size_t)i0 * QKV + h * hs;
                const real* k = base + C + kvh * hs;
                const real* v = base + C + NKV * hs + kvh * hs;
                gemm(0, 1, nq, n, hs, scale, q, QKV, k, QKV, 0, S, n);
                for (int r = 0; r < nq; r++) {
                    real* row = S + (size_t)r * n;
                    int lim = i0 + r + 1; /* causal: keys j <= i */
                    if (gated) {
                        const real* gr = gt + (size_t)r * n;
                        for (int j = 0; j < lim; j++) row[j] += gr[j];
                    }
                    real m = -INFINITY;
                    for (int j = 0; j < lim; j++) m = row[j] > m ? row[j] : m;
                    double sum = 0;
                    for (int j = 0; j < lim; j++) {
                        row[j] = (real)exp((double)(row[j] - m));
                        sum += row[j];
                    }
                    real inv = (real)(1.0 / sum);
                    for (int j = 0; j < lim; j++) row[j] *= inv;
                    for (int j = lim; j < n; j++) row[j] = 0;
                    lse[((size_t)b * NH + h) * T + i0 + r] = (real)(m + log(sum));
                }
                gemm(0, 0, nq, hs, n, 1, S, n, v, QKV, 0, out + ((size_t)b * T + i0) * C + h * hs,
                     C);
            }
        }
        free(S);
        free(gt);
    }
}

void attention_group_mass(real* mass, const real* qkv, const real* lse, const real* G, int K, int w,
                          int sinks, int B, int T, int NH, int NKV, int hs) {
    const int C = NH * hs, QKV = (NH + 2 * NKV) * hs, rep = NH / NKV;
    const int nblk = (T + BQ - 1) / BQ;
    const real scale = (real)(1.0 / sqrt((double)hs));
    memset(mass, 0, sizeof(real) * B * T * K);
#pragma omp parallel
    {
        real* S = mallocCheck(sizeof(real) * BQ * T);
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < B * nblk; task++) {
            int b = task / nblk, blk = nblk - 1 - task % nblk;
            int i0 = blk * BQ, nq = (T - i0 < BQ) ? T - i0 : BQ;
            int n = i0 + nq - w - 1; /* keys that are distant for some row of the block */
            if (n <= sinks) continue;
            const real* base = qkv + (size_t)b * T * QKV;
            for (int h = 0; h < NH; h++) {
                int kvh = h / rep;
                const real* q = base + (size_t)i0 * QKV + h * hs;
                const real* k = base + C + kvh * hs;
                const real* l = lse + ((size_t)b * NH + h) * T + i0;
                gemm(0, 1, nq, n, hs, scale, q, QKV, k, QKV, 0, S, n);
                for (int r = 0; r < nq; r++) {
                    real* p = S + (size_t)r * n;
                    int far = i0 + r - w; /* sinks <= j < far */
                    for (int j = 0; j < n; j++)
                        p[j] = j >= sinks && j < far ? (real)exp((double)(p[j] - l[r])) : 0;
                }
                gemm(0, 0, nq, K, n, 1, S, n, G + (size_t)b * T * K, K, 1,
                     mass + ((size_t)b * T + i0) * K, K);
            }
        }
        free(S);
    }
}

void attention_backward(real* dqkv, real* dG, real* dgate, const real* dout, const real* qkv,
                        const real* out, const real* lse, const AttnGate* gate, int B, int T,
                        int NH, int NKV, int hs) {
    const int C = NH * hs, QKV = (NH + 2 * NKV) * hs, rep = NH / NKV, KV2 = 2 * NKV * hs;
    const int nblk = (T + BQ - 1) / BQ;
    const real scale = (real)(1.0 / sqrt((double)hs));
    const int gated = gate && gate->mode != GATE_NONE;
    const int soft = gated && gate->mode == GATE_SOFT;
    const int K = gated ? gate->K : 0;
    const int nt = omp_get_max_threads();
    /* Per-thread accumulators: key/value gradients (B,T,2*NKV*hs), dG (B,T,K), dlambda, db. */
    real* dkv_t = callocCheck((size_t)nt * B * T * KV2, sizeof(real));
    real* dG_t = soft ? callocCheck((size_t)nt * B * T * K, sizeof(real)) : NULL;
    double* dgate_t = callocCheck((size_t)nt * 2, sizeof(double));
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num();
        real* dkv = dkv_t + (size_t)tid * B * T * KV2;
        real* dGp = soft ? dG_t + (size_t)tid * B * T * K : NULL;
        double dlam = 0, db = 0;
        real* S = mallocCheck(sizeof(real) * BQ * T);
        real* dP = mallocCheck(sizeof(real) * BQ * T);
        real* gt = gated ? mallocCheck(sizeof(real) * BQ * T) : NULL;
        real* aff = soft ? mallocCheck(sizeof(real) * BQ * T) : NULL;
        real* dgt = soft ? mallocCheck(sizeof(real) * BQ * T) : NULL;
        real D[BQ];
#pragma omp for schedule(static, 1)
        for (int task = 0; task < B * nblk; task++) {
            int b = task / nblk, blk = task % nblk;
            int i0 = blk * BQ, nq = (T - i0 < BQ) ? T - i0 : BQ, n = i0 + nq;
            const real* base = qkv + (size_t)b * T * QKV;
            if (gated) gate_block(gt, aff, gate, b, T, i0, nq, n);
            if (soft) memset(dgt, 0, sizeof(real) * nq * n);
            for (int h = 0; h < NH; h++) {
                int kvh = h / rep;
                const real* q = base + (size_t)i0 * QKV + h * hs;
                const real* k = base + C + kvh * hs;
                const real* v = base + C + NKV * hs + kvh * hs;
                const real* dO = dout + ((size_t)b * T + i0) * C + h * hs;
                const real* O = out + ((size_t)b * T + i0) * C + h * hs;
                const real* l = lse + ((size_t)b * NH + h) * T + i0;
                gemm(0, 1, nq, n, hs, scale, q, QKV, k, QKV, 0, S, n);
                gemm(0, 1, nq, n, hs, 1, dO, C, v, QKV, 0, dP, n);
                for (int r = 0; r < nq; r++) {
                    double d = 0;
                    for (int e = 0; e < hs; e++)
                        d += (double)dO[(size_t)r * C + e] * O[(size_t)r * C + e];
                    D[r] = (real)d;
                }
                for (int r = 0; r < nq; r++) {
                    real* p = S + (size_t)r * n;
                    real* ds = dP + (size_t)r * n;
                    const real* gr = gated ? gt + (size_t)r * n : NULL;
                    int lim = i0 + r + 1;
                    for (int j = 0; j < lim; j++) {
                        p[j] = (real)exp((double)(p[j] + (gr ? gr[j] : 0) - l[r]));
                        ds[j] = p[j] * (ds[j] - D[r]);
                    }
                    for (int j = lim; j < n; j++) p[j] = ds[j] = 0;
                    if (soft) {
                        real* dg = dgt + (size_t)r * n;
                        for (int j = 0; j < lim; j++) dg[j] += ds[j];
                    }
                }
                gemm(0, 0, nq, hs, n, scale, dP, n, k, QKV, 1,
                     dqkv + ((size_t)b * T + i0) * QKV + h * hs, QKV);
                real* dk = dkv + (size_t)b * T * KV2 + kvh * hs;
                real* dv = dk + NKV * hs;
                gemm(1, 0, n, hs, nq, scale, dP, n, q, QKV, 1, dk, KV2);
                gemm(1, 0, n, hs, nq, 1, S, n, dO, C, 1, dv, KV2);
            }
            if (soft) {
                /* d gate -> d a_ij -> d G_i (row) and d G_j (column). */
                for (int r = 0; r < nq; r++) {
                    int far = i0 + r - gate->w;
                    real* dg = dgt + (size_t)r * n;
                    const real* a = aff + (size_t)r * n;
                    for (int j = 0; j < n; j++) {
                        if (j >= far || j < gate->sinks) {
                            dg[j] = 0;
                            continue;
                        }
                        double x = gate->lambda * (a[j] - gate->bias);
                        double dx = dg[j] / (1.0 + exp(x)); /* d logsig(x)/dx = sigmoid(-x) */
                        dlam += dx * (a[j] - gate->bias);
                        db -= dx * gate->lambda;
                        dg[j] = (real)(dx * gate->lambda);
                    }
                }
                const real* Gb = gate->G + (size_t)b * T * K;
                gemm(0, 0, nq, K, n, 1, dgt, n, Gb, K, 1, dGp + ((size_t)b * T + i0) * K, K);
                gemm(1, 0, n, K, nq, 1, dgt, n, Gb + (size_t)i0 * K, K, 1, dGp + (size_t)b * T * K,
                     K);
            }
        }
        dgate_t[2 * tid] = dlam;
        dgate_t[2 * tid + 1] = db;
        free(S);
        free(dP);
        free(gt);
        free(aff);
        free(dgt);
    }
    /* Sum the per-thread buffers in thread order. */
#pragma omp parallel for
    for (size_t bt = 0; bt < (size_t)B * T; bt++) {
        real* d = dqkv + bt * QKV + C;
        for (int e = 0; e < KV2; e++) {
            real s = 0;
            for (int t = 0; t < nt; t++) s += dkv_t[((size_t)t * B * T + bt) * KV2 + e];
            d[e] += s;
        }
        if (soft) {
            for (int e = 0; e < K; e++) {
                real s = 0;
                for (int t = 0; t < nt; t++) s += dG_t[((size_t)t * B * T + bt) * K + e];
                dG[bt * K + e] += s;
            }
        }
    }
    if (soft && dgate) {
        double sl = 0, sb = 0;
        for (int t = 0; t < nt; t++) {
            sl += dgate_t[2 * t];
            sb += dgate_t[2 * t + 1];
        }
        dgate[0] += (real)sl;
        dgate[1] += (real)sb;
    }
    free(dkv_t);
    free(dG_t);
    free(dgate_t);
}
