/* router.c: router scores, the three routing modes and their backward passes.
 *
 * Log-space Sinkhorn alternates a column step (every group gets mass T/K) and a row step
 * (every token gets mass 1), ending on a row step. Both steps subtract a log-sum-exp, so
 * their backward passes only need the iterate AFTER the step:
 *   row step    L' = L - lse_k L          =>  dL = dL' - exp(L') * sum_k dL'
 *   column step L' = L - lse_t L + log(T/K) =>  dL = dL' - exp(L') K/T * sum_t dL'
 * The prefix (causal) column step uses lse over t' <= t and target mass (t+1)/K; its backward
 * runs a suffix recurrence (see prefix_col_backward). */
#include "router.h"

#include <math.h>
#include <string.h>

#include "cpu.h"

void router_scores_forward(real* proj, real* S, const real* h, const real* wg, const real* cent,
                           size_t N, int C, int dg, int K) {
    gemm(0, 0, (int)N, dg, C, 1, h, C, wg, dg, 0, proj, dg);
    gemm(0, 1, (int)N, K, dg, 1, proj, dg, cent, dg, 0, S, K);
}

void router_row_scores(real* proj, real* S, const real* h, const real* wg, const real* cent, int C,
                       int dg, int K) {
    /* proj in 16 columns at a time, each the sum of four chains (the rows c of wg with c % 4 =
     * 0, 1, 2, 3, in order), added as (a0 + a1) + (a2 + a3): four products in flight, not one
     * chain of C */
    for (int j0 = 0; j0 < dg; j0 += 16) {
        const int nj = dg - j0 < 16 ? dg - j0 : 16;
        real a[4][16] = {{0}};
        for (int c = 0; c < C; c++) {
            const real hc = h[c];
            const real* w = wg + (size_t)c * dg + j0;
            real* ac = a[c % 4];
#pragma omp simd
            for (int j = 0; j < nj; j++) ac[j] += hc * w[j];
        }
        for (int j = 0; j < nj; j++) proj[j0 + j] = (a[0][j] + a[1][j]) + (a[2][j] + a[3][j]);
    }
    for (int k = 0; k < K; k++) {
        const real* ck = cent + (size_t)k * dg;
        real s = 0;
        for (int j = 0; j < dg; j++) s += proj[j] * ck[j];
        S[k] = s;
    }
}

void router_scores_backward(real* dh, real* dwg, real* dcent, real* dproj, const real* dS,
                            const real* h, const real* proj, const real* wg, const real* cent,
                            size_t N, int C, int dg, int K) {
    gemm(0, 0, (int)N, dg, K, 1, dS, K, cent, dg, 0, dproj, dg);
    if (dcent) gemm(1, 0, K, dg, (int)N, 1, dS, K, proj, dg, 1, dcent, dg);
    if (dwg) gemm(1, 0, C, dg, (int)N, 1, h, C, dproj, dg, 1, dwg, dg);
    if (dh) gemm(0, 1, (int)N, C, dg, 1, dproj, dg, wg, dg, 1, dh, C);
}

static void row_step(real* L, int T, int K) {
    for (int t = 0; t < T; t++) {
        real* r = L + (size_t)t * K;
        double m = -INFINITY, s = 0;
        for (int k = 0; k < K; k++) m = r[k] > m ? r[k] : m;
        for (int k = 0; k < K; k++) s += exp(r[k] - m);
        double l = m + log(s);
        for (int k = 0; k < K; k++) r[k] = (real)(r[k] - l);
    }
}

/* Full-sequence column step; adds each group's subtracted offset to cum[k]. */
static void col_step(real* L, double* cum, int T, int K) {
    double target = log((double)T / K);
    for (int k = 0; k < K; k++) {
        double m = -INFINITY, s = 0;
        for (int t = 0; t < T; t++) m = L[(size_t)t * K + k] > m ? L[(size_t)t * K + k] : m;
        for (int t = 0; t < T; t++) s += exp(L[(size_t)t * K + k] - m);
        double c = m + log(s) - target;
        for (int t = 0; t < T; t++) L[(size_t)t * K + k] = (real)(L[(size_t)t * K + k] - c);
        if (cum) cum[k] += c;
    }
}

/* Prefix lse: pm[t,k] = log sum_{t' <= t} exp(L[t',k]). */
static void prefix_lse(double* pm, const real* L, int T, int K) {
    for (int k = 0; k < K; k++) {
        double m = -INFINITY;
        for (int t = 0; t < T; t++) {
            double x = L[(size_t)t * K + k];
            double hi = m > x ? m : x;
            m = hi == -INFINITY ? -INFINITY : hi + log(exp(m - hi) + exp(x - hi));
            pm[(size_t)t * K + k] = m;
        }
    }
}

static void prefix_col_step(real* L, double* pm, double* cum, int T, int K) {
    prefix_lse(pm, L, T, K);
    for (int t = 0; t < T; t++) {
        double target = log((double)(t + 1) / K);
        for (int k = 0; k < K; k++) {
            double c = pm[(size_t)t * K + k] - target;
            L[(size_t)t * K + k] = (real)(L[(size_t)t * K + k] - c);
            if (cum && t == T - 1) cum[k] += c;
        }
    }
}

/* dL (in place on d) for the prefix column step, given the iterate BEFORE the step (Lpre):
 *   dL[t'] = dL'[t'] - exp(Lpre[t'] - m[t']) * A[t'],
 *   A[t'] = sum_{t >= t'} dL'[t] exp(m[t'] - m[t]) = dL'[t'] + exp(m[t'] - m[t'+1]) A[t'+1],
 * stable because the prefix lse m is non-decreasing in t. */
static void prefix_col_backward(real* d, const real* Lpre, double* pm, int T, int K) {
    prefix_lse(pm, Lpre, T, K);
    for (int k = 0; k < K; k++) {
        double A = 0;
        for (int t = T - 1; t >= 0; t--) {
            size_t at = (size_t)t * K + k;
            double next = (t + 1 < T) ? exp(pm[at] - pm[at + K]) * A : 0;
            A = d[at] + next;
            d[at] = (real)(d[at] - exp(Lpre[at] - pm[at]) * A);
        }
    }
}

static void centre_offsets(real* colofs, const double* cum, int K) {
    double mean = 0;
    for (int k = 0; k < K; k++) mean += -cum[k];
    mean /= K;
    for (int k = 0; k < K; k++) colofs[k] = (real)(-cum[k] - mean);
}

/* routing_forward's sequence b */
static void route_sequence(real* G, real* colofs, const real* S, const real* beta, Routing mode,
                           int b, int T, int K, real tau, int iters) {
    const real* Sb = S + (size_t)b * T * K;
    real* Gb = G + (size_t)b * T * K;
    if (mode == ROUTE_CAUSAL) {
        for (size_t i = 0; i < (size_t)T * K; i++) Gb[i] = Sb[i] / tau + (beta ? beta[i % K] : 0);
        row_step(Gb, T, K);
    } else {
        double cum[32] = {0};
        double* pm = mode == ROUTE_PREFIX ? mallocCheck(sizeof(double) * T * K) : NULL;
        for (size_t i = 0; i < (size_t)T * K; i++) Gb[i] = Sb[i] / tau;
        for (int it = 0; it < iters; it++) {
            if (mode == ROUTE_PREFIX)
                prefix_col_step(Gb, pm, cum, T, K);
            else
                col_step(Gb, cum, T, K);
            row_step(Gb, T, K);
        }
        free(pm);
        if (colofs) centre_offsets(colofs + (size_t)b * K, cum, K);
    }
    for (size_t i = 0; i < (size_t)T * K; i++) Gb[i] = (real)exp(Gb[i]);
}

void routing_forward(real* G, real* colofs, const real* S, const real* beta, Routing mode, int B,
                     int T, int K, real tau, int iters) {
    if (B == 1) { /* a decoded row: no threads to wake (kernels/cpu.h) */
        route_sequence(G, colofs, S, beta, mode, 0, T, K, tau, iters);
        return;
    }
#pragma omp parallel for
    for (int b = 0; b < B; b++) route_sequence(G, colofs, S, beta, mode, b, T, K, tau, iters);
}

/* dL -= exp(L') * colsum or rowsum of dL (the two log-sum-exp steps), in place on d. */
static void row_step_backward(real* d, const real* Lpost, int T, int K) {
    for (int t = 0; t < T; t++) {
        double s = 0;
        for (int k = 0; k < K; k++) s += d[(size_t)t * K + k];
        for (int k = 0; k < K; k++)
            d[(size_t)t * K + k] -= (real)(exp(Lpost[(size_t)t * K + k]) * s);
    }
}

static void col_step_backward(real* d, const real* Lpost, int T, int K) {
    for (int k = 0; k < K; k++) {
        double s = 0;
        for (int t = 0; t < T; t++) s += d[(size_t)t * K + k];
        for (int t = 0; t < T; t++)
            d[(size_t)t * K + k] -= (real)(exp(Lpost[(size_t)t * K + k]) * K / T * s);
    }
}

void routing_backward(real* dS, const real* dG, const real* S, const real* G, const real* beta,
                      Routing mode, int B, int T, int K, real tau, int iters) {
    const size_t TK = (size_t)T * K;
    const int nit = mode == ROUTE_CAUSAL ? 0 : iters;
#pragma omp parallel for
    for (int b = 0; b < B; b++) {
        const real* Sb = S + b * TK;
        /* Ls[0] = S / tau (+ beta); Ls[2i+1] after column step i; Ls[2i+2] after row step i. */
        real* Ls = mallocCheck(sizeof(real) * TK * (2 * nit + 2));
        double* pm = mode == ROUTE_PREFIX ? mallocCheck(sizeof(double) * TK) : NULL;
        real* d = mallocCheck(sizeof(real) * TK);
        for (size_t i = 0; i < TK; i++)
            Ls[i] = Sb[i] / tau + (mode == ROUTE_CAUSAL && beta ? beta[i % K] : 0);
        for (int it = 0; it < nit; it++) {
            memcpy(Ls + (2 * it + 1) * TK, Ls + 2 * it * TK, sizeof(real) * TK);
            if (mode == ROUTE_PREFIX)
                prefix_col_step(Ls + (2 * it + 1) * TK, pm, NULL, T, K);
            else
                col_step(Ls + (2 * it + 1) * TK, NULL, T, K);
            memcpy(Ls + (2 * it + 2) * TK, Ls + (2 * it + 1) * TK, sizeof(real) * TK);
            row_step(Ls + (2 * it + 2) * TK, T, K);
        }
        if (mode == ROUTE_CAUSAL) {
            memcpy(Ls + TK, Ls, sizeof(real) * TK);
            row_step(Ls + TK, T, K);
        }
        const real* Lfinal = Ls + (mode == ROUTE_CAUSAL ? 1 : 2 * nit) * TK;
        const real* Gb = G + b * TK;
        for (size_t i = 0; i < TK; i++) d[i] = dG[b * TK + i] * Gb[i]; /* G = exp(L_final) */
        if (mode == ROUTE_CAUSAL) {
            row_step_backward(d, Lfinal, T, K);
        } else {
            for (int it = nit - 1; it >= 0; it--) {
                row_step_backward(d, Ls + (2 * it + 2) * TK, T, K);
                if (mode == ROUTE_PREFIX)
                    prefix_col_backward(d, Ls + 2 * it * TK, pm, T, K);
                else
                    col_step_backward(d, Ls + (2 * it + 1) * TK, T, K);
            }
        }
        real* dSb = dS + b * TK;
        for (size_t i = 0; i < TK; i++) dSb[i] += d[i] / tau;
        free(Ls);
        free(pm);
        free(d);
    }
}

void routing_topk_mask(uint32_t* mask, const real* G, int B, int T, int K, int topk, real topp,
                       int sinks, int pos0) {
    for (size_t n = 0; n < (size_t)B * T; n++)
        mask[n] = topk_mask_row(G + n * K, K, topk, topp, pos0 + (int)(n % (size_t)T), sinks);
}

double routing_largest_share(const real* G, size_t N, int K) {
    size_t count[32] = {0};
    for (size_t n = 0; n < N; n++) {
        int best = 0;
        for (int k = 1; k < K; k++) best = G[n * K + k] > G[n * K + best] ? k : best;
        count[best]++;
    }
    size_t mx = 0;
    for (int k = 0; k < K; k++) mx = count[k] > mx ? count[k] : mx;
    return N ? (double)mx / (double)N : 0;
}

const char* routing_name(Routing r) {
    return r == ROUTE_SINKHORN ? "sinkhorn" : r == ROUTE_CAUSAL ? "causal" : "prefix_sinkhorn";
}

int routing_parse(const char* s, Routing* out) {
    if (!strcmp(s, "sinkhorn"))
        *out = ROUTE_SINKHORN;
    else if (!strcmp(s, "causal"))
        *out = ROUTE_CAUSAL;
    else if (!strcmp(s, "prefix_sinkhorn"))
        *out = ROUTE_PREFIX;
    else
        return -1;
    return 0;
}

static uint64_t mix64(uint64_t x) { /* splitmix64's finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void routing_random_mask(uint32_t* mask, int B, int T, int K, int topk, int sinks, int pos0,
                         uint64_t seed) {
    const int k = topk > 0 && topk < K ? topk : K;
    for (int t = 0; t < T; t++) {
        const int p = pos0 + t;
        uint32_t m = 0;
        if (p < sinks || k == K) {
            m = K >= 32 ? 0xffffffffu : (1u << K) - 1u;
        } else {
            uint64_t h = mix64(seed ^ mix64((uint64_t)p));
            while (__builtin_popcount(m) < k) {
                m |= 1u << (h % (uint64_t)K);
                h = mix64(h);
            }
        }
        for (int b = 0; b < B; b++) mask[(size_t)b * T + t] = m;
    }
}

void routing_shares(double* col, const real* S, size_t first, size_t N, size_t step, int K,
                    real tau, const double* beta) {
    for (int k = 0; k <= K; k++) col[k] = 0;
    for (size_t t = first; t < N; t += step) {
        const real* s = S + t * K;
        double x[32], mx = -INFINITY, z = 0;
        for (int k = 0; k < K; k++) {
            x[k] = s[k] / tau + beta[k];
            mx = x[k] > mx ? x[k] : mx;
        }
        for (int k = 0; k < K; k++) z += x[k] = exp(x[k] - mx);
        for (int k = 0; k < K; k++) col[k] += x[k] / z;
        col[K] += 1;
    }
}

void routing_beta_step(double* beta, const double* col, int K) {
    if (col[K] <= 0) return;
    double mean = 0;
    for (int k = 0; k < K; k++) {
        double share = col[k] / col[K] * K;
        beta[k] -= log(share > 1.0 / K ? share : 1.0 / K);
        mean += beta[k] / K;
    }
    for (int k = 0; k < K; k++) beta[k] -= mean;
}
