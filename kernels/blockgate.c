/* blockgate.c: fitting the learned block selector (see blockgate.h). */
#include "blockgate.h"

#include <math.h>
#include <string.h>

#include <omp.h>

#include "cpu.h"

void blockfit_init(BlockFit* f, int L, int NH, int NKV, int hs, int bs, int w, int sinks) {
    memset(f, 0, sizeof *f);
    f->L = L, f->NH = NH, f->NKV = NKV, f->hs = hs, f->bs = bs, f->w = w, f->sinks = sinks;
    f->nwin = mallocCheck(sizeof(int) * (size_t)L);
    memset(f->nwin, 0, sizeof(int) * (size_t)L);
}

void blockfit_free(BlockFit* f) {
    for (int l = 0; l < f->L; l++)
        for (int k = 0; k < f->nwin[l]; k++) {
            BlockFitWindow* x = &f->win[(size_t)l * f->cap + k];
            free(x->pos), free(x->q), free(x->lband), free(x->lz), free(x->logn), free(x->st);
        }
    free(f->win);
    free(f->nwin);
    memset(f, 0, sizeof *f);
}

long blockfit_samples(const BlockFit* f, int l) {
    long n = 0;
    for (int k = 0; k < f->nwin[l]; k++) n += f->win[(size_t)l * f->cap + k].nq;
    return n;
}

/* The candidate blocks [c0, c1) of query i (as attention_blocks_forward). */
static void candidates(const BlockFit* f, int i, int* c0, int* c1) {
    const int far_end = i - f->w;
    *c0 = f->sinks / f->bs;
    *c1 = far_end > f->sinks ? (far_end - 1) / f->bs + 1 : *c0;
}

/* log sum exp(s[j]) over j in [j0, j1); -inf for an empty range */
static real range_lse(const real* s, int j0, int j1) {
    real mx = -INFINITY;
    for (int j = j0; j < j1; j++) mx = s[j] > mx ? s[j] : mx;
    if (mx == -INFINITY) return mx;
    double sum = 0;
    for (int j = j0; j < j1; j++) sum += exp((double)(s[j] - mx));
    return mx + (real)log(sum);
}

/* Grow layer l's windows by one; returns it. */
static BlockFitWindow* new_window(BlockFit* f, int l) {
    if (f->nwin[l] == f->cap) { /* double the allotment of every layer */
        const int cap = f->cap ? 2 * f->cap : 4;
        BlockFitWindow* w = mallocCheck(sizeof *w * (size_t)f->L * cap);
        memset(w, 0, sizeof *w * (size_t)f->L * cap);
        for (int k = 0; k < f->L; k++)
            for (int j = 0; j < f->nwin[k]; j++)
                w[(size_t)k * cap + j] = f->win[(size_t)k * f->cap + j];
        free(f->win);
        f->win = w, f->cap = cap;
    }
    return &f->win[(size_t)l * f->cap + f->nwin[l]++];
}

void blockfit_add(BlockFit* f, int l, const real* qkv, int T, int nq, uint64_t seed) {
    const int NH = f->NH, NKV = f->NKV, hs = f->hs, bs = f->bs, rep = NH / NKV;
    const int C = NH * hs, QKV = (NH + 2 * NKV) * hs, nb = (T + bs - 1) / bs;
    const int first = f->sinks + f->w + 2 * bs; /* the first position with two candidates */
    if (nq <= 0 || first >= T) return;
    BlockFitWindow* x = new_window(f, l);
    x->T = T, x->nq = nq, x->nb = nb;
    x->pos = mallocCheck(sizeof(int) * nq);
    x->q = mallocCheck(sizeof(real) * (size_t)nq * NH * hs);
    x->lband = mallocCheck(sizeof(real) * (size_t)nq * NH);
    x->lz = mallocCheck(sizeof(real) * (size_t)nq * NH * nb);
    x->logn = mallocCheck(sizeof(real) * (size_t)nq * nb);
    x->st = mallocCheck(sizeof(real) * (size_t)NKV * nb * BLOCKGATE_STATS(hs));
    Rng rng;
    rng_seed(&rng, seed);
    for (int s = 0; s < nq; s++) { /* stratified: one position in each of nq equal spans */
        const double u = (s + rng_uniform(&rng)) / nq;
        int i = first + (int)(u * (T - first));
        x->pos[s] = i < T ? i : T - 1;
    }
    for (int kvh = 0; kvh < NKV; kvh++)
        for (int c = 0; c < nb; c++)
            blockgate_key_stats(x->st + ((size_t)kvh * nb + c) * BLOCKGATE_STATS(hs),
                                qkv + C + kvh * hs, QKV, c * bs,
                                (c + 1) * bs < T ? (c + 1) * bs : T, hs);
    const real scale = (real)(1.0 / sqrt((double)hs));
    real* Q = mallocCheck(sizeof(real) * (size_t)nq * hs);
    real* S = mallocCheck(sizeof(real) * (size_t)nq * T);
    for (int h = 0; h < NH; h++) {
        const int kvh = h / rep;
        for (int s = 0; s < nq; s++) {
            memcpy(Q + (size_t)s * hs, qkv + (size_t)x->pos[s] * QKV + h * hs, sizeof(real) * hs);
            memcpy(x->q + ((size_t)s * NH + h) * hs, Q + (size_t)s * hs, sizeof(real) * hs);
        }
        gemm(0, 1, nq, T, hs, scale, Q, hs, qkv + C + kvh * hs, QKV, 0, S, T);
#pragma omp parallel for schedule(static)
        for (int s = 0; s < nq; s++) {
            const int i = x->pos[s], far_end = i - f->w;
            real* row = S + (size_t)s * T;
            int c0, c1;
            candidates(f, i, &c0, &c1);
            /* the band: the sinks [0, min(sinks, i + 1)) and [max(sinks, i - w), i] */
            const int s1 = f->sinks < i + 1 ? f->sinks : i + 1;
            const int b0 = far_end > s1 ? far_end : s1;
            const real a = range_lse(row, 0, s1), b = range_lse(row, b0, i + 1);
            const real mx = a > b ? a : b;
            x->lband[(size_t)s * NH + h] =
                mx == -INFINITY ? mx
                                : mx + (real)log(exp((double)(a - mx)) + exp((double)(b - mx)));
            real* lz = x->lz + ((size_t)s * NH + h) * nb;
            real* ln = x->logn + (size_t)s * nb;
            for (int c = 0; c < nb; c++) {
                int j0 = c * bs > f->sinks ? c * bs : f->sinks;
                int j1 = (c + 1) * bs < far_end ? (c + 1) * bs : far_end;
                const int cand = c >= c0 && c < c1 && j1 > j0;
                lz[c] = cand ? range_lse(row, j0, j1) : -INFINITY;
                if (h == 0) ln[c] = cand ? (real)log((double)(j1 - j0)) : -INFINITY;
            }
        }
    }
    free(Q);
    free(S);
}

/* The selector's inputs of one query head: U = [a x | b x^2 | g min(x, 0) | g max(x, 0)] with
 * x = scale q, so that U . [mean | var | lo | hi] = s_c - w_0 (sparse.h). */
static void selector_row(real* U, const real* wgt, const real* q, int hs, real scale) {
    const real *a = wgt + 1, *b = a + hs, *g = b + hs;
    for (int e = 0; e < hs; e++) {
        const real x = scale * q[e];
        U[e] = a[e] * x;
        U[hs + e] = b[e] * x * x;
        U[2 * hs + e] = g[e] * (x < 0 ? x : 0);
        U[3 * hs + e] = g[e] * (x > 0 ? x : 0);
    }
}

/* Per sample of one window and query head: the logits s_c + log n_c of its candidates into S
 * (nq, nb; -inf elsewhere). U: nq x 4 hs scratch. */
static void window_logits(real* S, real* U, const BlockFit* f, const BlockFitWindow* x, int h,
                          const real* wgt) {
    const int hs = f->hs, nb = x->nb, W4 = BLOCKGATE_STATS(hs), kvh = h / (f->NH / f->NKV);
    const real scale = (real)(1.0 / sqrt((double)hs));
    for (int s = 0; s < x->nq; s++)
        selector_row(U + (size_t)s * W4, wgt, x->q + ((size_t)s * f->NH + h) * hs, hs, scale);
    gemm(0, 1, x->nq, nb, W4, 1, U, W4, x->st + (size_t)kvh * nb * W4, W4, 0, S, nb);
    for (size_t t = 0; t < (size_t)x->nq * nb; t++)
        S[t] = x->logn[t] == -INFINITY ? -INFINITY : S[t] + wgt[0] + x->logn[t];
}

double blockfit_loss(const BlockFit* f, int l, int h, const real* wgt, real* grad) {
    const int hs = f->hs, W4 = BLOCKGATE_STATS(hs), NH = f->NH;
    const real scale = (real)(1.0 / sqrt((double)hs));
    const long n = blockfit_samples(f, l);
    if (grad) memset(grad, 0, sizeof(real) * BLOCKGATE_WIDTH(hs));
    if (!n) return 0;
    double loss = 0, g0 = 0;
    double* gw = mallocCheck(sizeof(double) * W4);
    memset(gw, 0, sizeof(double) * W4);
    for (int k = 0; k < f->nwin[l]; k++) {
        const BlockFitWindow* x = &f->win[(size_t)l * f->cap + k];
        const int nq = x->nq, nb = x->nb;
        real* S = mallocCheck(sizeof(real) * (size_t)nq * nb);
        real* U = mallocCheck(sizeof(real) * (size_t)nq * W4);
        window_logits(S, U, f, x, h, wgt);
        for (int s = 0; s < nq; s++) {
            real* p = S + (size_t)s * nb; /* logits, then p - t */
            const real* lz = x->lz + ((size_t)s * NH + h) * nb;
            const real lb = x->lband[(size_t)s * NH + h];
            real mp = lb, mt = lb;
            for (int c = 0; c < nb; c++) {
                mp = p[c] > mp ? p[c] : mp;
                mt = lz[c] > mt ? lz[c] : mt;
            }
            double zp = exp((double)(lb - mp)), zt = exp((double)(lb - mt));
            for (int c = 0; c < nb; c++) {
                if (p[c] > -INFINITY) zp += exp((double)(p[c] - mp));
                if (lz[c] > -INFINITY) zt += exp((double)(lz[c] - mt));
            }
            const double Lp = mp + log(zp), Lt = mt + log(zt);
            /* KL(t || p) = sum t (log t - log p); the band's logit is the same in both */
            double kl = exp(lb - Lt) * ((lb - Lt) - (lb - Lp));
            for (int c = 0; c < nb; c++) {
                if (lz[c] == -INFINITY) {
                    p[c] = 0;
                    continue;
                }
                const double lt = lz[c] - Lt, lq = p[c] - Lp, t = exp(lt);
                kl += t * (lt - lq);
                p[c] = (real)(exp(lq) - t);
                g0 += p[c];
            }
            loss += kl;
        }
        if (grad) { /* D = G . St, then back through U's products */
            const int kvh = h / (NH / f->NKV);
            gemm(0, 0, nq, W4, nb, 1, S, nb, x->st + (size_t)kvh * nb * W4, W4, 0, U, W4);
            for (int s = 0; s < nq; s++) {
                const real* q = x->q + ((size_t)s * NH + h) * hs;
                const real* D = U + (size_t)s * W4;
                for (int e = 0; e < hs; e++) {
                    const double xe = scale * q[e];
                    gw[e] += D[e] * xe;
                    gw[hs + e] += D[hs + e] * xe * xe;
                    gw[2 * hs + e] += xe < 0 ? D[2 * hs + e] * xe : D[3 * hs + e] * xe;
                }
            }
        }
        free(S);
        free(U);
    }
    if (grad) {
        grad[0] = (real)(g0 / n);
        for (int e = 0; e < 3 * hs; e++) grad[1 + e] = (real)(gw[e] / n);
    }
    free(gw);
    return loss / n;
}

void blockfit_solve(const BlockFit* f, real* wgt, int iters, real lr, double* before,
                    double* after) {
    const int W = BLOCKGATE_WIDTH(f->hs), tasks = f->L * f->NH;
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < tasks; t++) {
        const int l = t / f->NH, h = t % f->NH;
        real* w = wgt + (size_t)t * W;
        real* g = mallocCheck(sizeof(real) * W);
        double* m = mallocCheck(sizeof(double) * W);
        double* v = mallocCheck(sizeof(double) * W);
        memset(m, 0, sizeof(double) * W);
        memset(v, 0, sizeof(double) * W);
        double loss = blockfit_loss(f, l, h, w, g);
        if (before) before[t] = loss;
        const double b1 = 0.9, b2 = 0.999;
        for (int it = 1; it <= iters; it++) {
            for (int e = 0; e < W; e++) {
                m[e] = b1 * m[e] + (1 - b1) * g[e];
                v[e] = b2 * v[e] + (1 - b2) * g[e] * g[e];
                const double mh = m[e] / (1 - pow(b1, it)), vh = v[e] / (1 - pow(b2, it));
                w[e] -= (real)(lr * mh / (sqrt(vh) + 1e-8));
            }
            loss = blockfit_loss(f, l, h, w, g);
        }
        if (after) after[t] = loss;
        free(g), free(m), free(v);
    }
}

/* candidate order: score descending, ties to the earlier block (the kernels' rule) */
typedef struct {
    real score;
    int c;
} Ranked;

static int by_score(const void* a, const void* b) {
    const Ranked *x = a, *y = b;
    if (x->score != y->score) return x->score < y->score ? 1 : -1;
    return x->c - y->c;
}

double blockfit_kept(const BlockFit* f, int l, BlockScore how, const real* wgt, int nsel) {
    double* k = mallocCheck(sizeof(double) * (size_t)(nsel + 1));
    blockfit_kept_curve(f, l, how, wgt, nsel, k);
    const double r = k[nsel];
    free(k);
    return r;
}

void blockfit_allocate(const double* curves, int L, int nmax, int n0, int floor, int* blocks) {
    floor = floor < n0 ? floor : n0;
    for (int l = 0; l < L; l++) blocks[l] = floor;
    for (long t = (long)L * floor; t < (long)L * n0; t++) {
        int best = -1;
        double gain = -1;
        for (int l = 0; l < L; l++) {
            if (blocks[l] >= nmax) continue;
            const double* k = curves + (size_t)l * (nmax + 1);
            const double g = k[blocks[l] + 1] - k[blocks[l]];
            if (g > gain) gain = g, best = l;
        }
        if (best < 0) break;
        blocks[best]++;
    }
}

void blockfit_kept_curve(const BlockFit* f, int l, BlockScore how, const real* wgt, int nmax,
                         double* kept_out) {
    const int NH = f->NH, NKV = f->NKV, hs = f->hs, rep = NH / NKV, W4 = BLOCKGATE_STATS(hs);
    const real scale = (real)(1.0 / sqrt((double)hs));
    double* kept = mallocCheck(sizeof(double) * (size_t)(nmax + 1));
    for (int n = 0; n <= nmax; n++) kept[n] = 0;
    long count = 0;
    for (int k = 0; k < f->nwin[l]; k++) {
        const BlockFitWindow* x = &f->win[(size_t)l * f->cap + k];
        const int nb = x->nb;
#pragma omp parallel reduction(+ : count)
        {
            double* mine = mallocCheck(sizeof(double) * (size_t)(nmax + 1));
            for (int n = 0; n <= nmax; n++) mine[n] = 0;
            real* mass = mallocCheck(sizeof(real) * nb);
            real* sc = mallocCheck(sizeof(real) * nb);
            real* lg = mallocCheck(sizeof(real) * nb);
            Ranked* rk = mallocCheck(sizeof(Ranked) * nb);
#pragma omp for schedule(dynamic, 4)
            for (int t = 0; t < x->nq * NKV; t++) {
                const int s = t / NKV, kvh = t % NKV;
                double band = 0;
                int c0, c1;
                candidates(f, x->pos[s], &c0, &c1);
                for (int c = 0; c < nb; c++) mass[c] = 0, sc[c] = 0;
                for (int r = 0; r < rep; r++) {
                    const int h = kvh * rep + r;
                    const real* lz = x->lz + ((size_t)s * NH + h) * nb;
                    const real* q = x->q + ((size_t)s * NH + h) * hs;
                    const real lb = x->lband[(size_t)s * NH + h];
                    real mx = lb;
                    for (int c = 0; c < nb; c++) mx = lz[c] > mx ? lz[c] : mx;
                    double z = exp((double)(lb - mx));
                    for (int c = 0; c < nb; c++)
                        if (lz[c] > -INFINITY) z += exp((double)(lz[c] - mx));
                    const double L = mx + log(z);
                    band += exp(lb - L);
                    for (int c = 0; c < nb; c++)
                        if (lz[c] > -INFINITY) mass[c] += (real)exp(lz[c] - L);
                    if (how == BLOCKS_LEARNED) {
                        const real* wg = wgt + (size_t)h * BLOCKGATE_WIDTH(hs);
                        real m2 = lb;
                        for (int c = c0; c < c1; c++) {
                            lg[c] =
                                x->logn[(size_t)s * nb + c] == -INFINITY
                                    ? -INFINITY
                                    : blockgate_logit(wg, q, x->st + ((size_t)kvh * nb + c) * W4,
                                                      hs, scale) +
                                          x->logn[(size_t)s * nb + c];
                            m2 = lg[c] > m2 ? lg[c] : m2;
                        }
                        double z2 = exp((double)(lb - m2));
                        for (int c = c0; c < c1; c++)
                            if (lg[c] > -INFINITY) z2 += exp((double)(lg[c] - m2));
                        for (int c = c0; c < c1; c++)
                            if (lg[c] > -INFINITY) sc[c] += (real)exp(lg[c] - m2 - log(z2));
                    } else if (how != BLOCKS_ORACLE) {
                        for (int c = c0; c < c1; c++) {
                            const real* st = x->st + ((size_t)kvh * nb + c) * W4;
                            real v = 0;
                            for (int e = 0; e < hs; e++) {
                                if (how == BLOCKS_MEAN) {
                                    v += q[e] * st[e];
                                } else {
                                    const real a = q[e] * st[2 * hs + e], b = q[e] * st[3 * hs + e];
                                    v += a > b ? a : b;
                                }
                            }
                            sc[c] += v;
                        }
                    }
                }
                if (how == BLOCKS_ORACLE)
                    for (int c = c0; c < c1; c++) sc[c] = mass[c];
                /* budget n keeps all candidates when they are at most n, else the n best */
                int nr = 0;
                for (int c = c0; c < c1; c++) rk[nr].score = sc[c], rk[nr++].c = c;
                qsort(rk, (size_t)nr, sizeof *rk, by_score);
                double all = band;
                for (int c = c0; c < c1; c++) all += mass[c];
                double got = band;
                for (int n = 0; n <= nmax; n++) {
                    if (n >= nr) {
                        mine[n] += all / rep;
                        continue;
                    }
                    mine[n] += got / rep;
                    if (rk[n].score > -INFINITY) got += mass[rk[n].c];
                }
                count++;
            }
#pragma omp critical
            for (int n = 0; n <= nmax; n++) kept[n] += mine[n];
            free(mass), free(sc), free(lg), free(rk), free(mine);
        }
    }
    for (int n = 0; n <= nmax; n++) kept_out[n] = count ? kept[n] / count : 1;
    free(kept);
}
